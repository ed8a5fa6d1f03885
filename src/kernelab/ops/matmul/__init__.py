"""Matrix multiplication: dense, fp8 and weight-only (int4, int8) GEMMs."""
