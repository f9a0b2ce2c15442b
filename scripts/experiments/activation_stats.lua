-- activation_stats.lua — the built-in observation experiment as an experiment file, for
-- `ember --experiment scripts/experiments/activation_stats.lua --experiment-args "output=stats.json"`.
-- Must stay a pointer: the experiment itself is lib/ember/experiments/activation_stats.lua.
return require("ember.experiments.activation_stats")
