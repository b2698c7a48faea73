"""Support shared by the tests and the benchmarks: the naive fp64-capable reference loss, random loss
batches, and the one tolerance rule kernels are held to."""
