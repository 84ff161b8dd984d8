"""Running the models: compiled steps (`fast`), losses and targets (`training`), sharding over
devices (`sharding`), matmul precision (`precision`), generation with a KV cache
(`generation`) and the allocator setting of the benchmarks (`malloc`)."""
