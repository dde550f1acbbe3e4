"""Method descriptors: each recipe is passes + training + runtime policy."""
