"""Side-by-side benchmarks: our plain and speculative decoding against transformers' generate."""
