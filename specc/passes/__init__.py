"""Graph passes every method can use: one verb-named pass per module, each with a typed config.

A pass only one method runs lives in that method's package (e.g. `specc.methods.swift.skip_sublayers`);
the graph patterns passes share are in `specc.graph.patterns`.
"""
