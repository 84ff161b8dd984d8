"""The Flax MNIST CNN: conv [bn] relu pool, conv [bn] relu pool, fc1 [dropout] relu, fc2."""
