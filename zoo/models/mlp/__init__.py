"""3-layer MLP: fc1 -> act -> fc2 -> act -> fc3."""
