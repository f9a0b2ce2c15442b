-- ember.compose — the path ember.run.compose had before the library moved into rooms, kept so that
-- scripts requiring it keep working. Must hold nothing of its own (tests/check_requires.lua).
return require("ember.run.compose")
