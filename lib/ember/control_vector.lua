-- ember.control_vector — the path ember.run.control_vector had before the library moved into rooms, kept so that
-- scripts requiring it keep working. Must hold nothing of its own (tests/check_requires.lua).
return require("ember.run.control_vector")
