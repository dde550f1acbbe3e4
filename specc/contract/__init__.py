"""The method contract: what a method is (descriptor, recipe, training result), its typed
config, the passes every method's graphs start with, and the checks a method runs on its
settings. `specc.extension` re-exports what an out-of-tree method needs; the built-in
methods in `specc.methods` are plugins of this contract like any other."""
