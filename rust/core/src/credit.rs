//! Credit accounting for one remote input channel and its gate: pure state, no I/O.
//! (Being written; see the module docs once filled in.)
