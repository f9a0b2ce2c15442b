-- zero_layer_output.lua — the built-in zeroing intervention as an experiment file, for
-- `ember --experiment scripts/experiments/zero_layer_output.lua --experiment-args 4:attention`.
-- Must stay a pointer: the experiment itself is lib/ember/experiments/zero_layer_output.lua.
return require("ember.experiments.zero_layer_output")
