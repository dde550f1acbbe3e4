"""The method contract. Its compile half: what a method is (descriptor, recipe, training
result), its typed config, the passes every method's graphs start with, and the checks a
method runs on its settings. Its runtime half: what a method's runtime hands the loop
(`drafter`: target, drafter, draft, budget, capabilities), what a target forward returns and
what the loop accepted of it (`verification`), token trees (`tree`) and the sampling asked
for (`sampling`). `specc.runtime` implements the loop against it; `specc.extension`
re-exports what an out-of-tree method needs; the built-in methods in `specc.methods` are
plugins of this contract like any other."""
