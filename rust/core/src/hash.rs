//! Spark SQL's `hash(cols...)`: Murmur3 x86_32, seed 42, chained over columns, nulls skipped.
//! (Being written.)
