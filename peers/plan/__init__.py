"""Which member holds which layers: the layer arithmetic, the planner, the roster of members and the gate that lets a re-plan take its turn."""
