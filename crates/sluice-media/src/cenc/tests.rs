//! Synthetic round trips: encrypt known samples, box them, decrypt, compare.
