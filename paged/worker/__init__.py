"""The worker side: the KV cache pool, the attention backend, the model runner and the sampler."""
