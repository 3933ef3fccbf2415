"""Models: load one rank's shard (`shard.load_shard`), model facts without MLX (`model_info`),
the deterministic tiny model and tokenizer (`tiny`, `tiny_tokenizer`), chat templates (`chat`)."""
