"""The algorithm: events, sampling rules, drafters and the decoding loops. Imports nothing else of specviz."""
