#include "../benchmarks/probes/decode_variants.cu"
GROUPED(4, 3, l)
GROUPED(2, 2, l)
GROUPED(2, 4, l)
GROUPED(8, 1, l)
GROUPED(8, 2, l)
GROUPED(4, 2, r)
