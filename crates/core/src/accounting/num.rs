//! Checked numeric helpers that reproduce Python's semantics (rounding, true division, `int()`).
//!
//! Every reference computes with Python ints and IEEE doubles; an integer converted to `f64` is only
//! exact below 2^53, so anything larger is refused rather than silently rounded.

use super::error::AccountingError;

/// Largest integer every `f64` operation here represents exactly.
pub(super) const EXACT_F64: u64 = 1 << 53;

/// `n as f64`, refusing values that would round.
pub(super) fn exact(n: u64, what: &'static str) -> Result<f64, AccountingError> {
    if n > EXACT_F64 {
        return Err(AccountingError::Overflow { what });
    }
    Ok(n as f64)
}

/// A non-negative integral `f64` (result of floor/ceil/round/trunc) back to `u64`.
pub(super) fn to_u64(x: f64, what: &'static str) -> Result<u64, AccountingError> {
    if !x.is_finite() || !(0.0..=EXACT_F64 as f64).contains(&x) {
        return Err(AccountingError::Overflow { what });
    }
    // In range and integral by construction; `trunc` keeps Python's `int()` meaning for callers
    // that pass an unrounded value.
    Ok(x.trunc() as u64)
}

/// Final narrowing of a token count.
pub(super) fn to_u32(n: u64, what: &'static str) -> Result<u32, AccountingError> {
    u32::try_from(n).map_err(|_| AccountingError::Overflow { what })
}

pub(super) fn mul(a: u64, b: u64, what: &'static str) -> Result<u64, AccountingError> {
    a.checked_mul(b).ok_or(AccountingError::Overflow { what })
}

pub(super) fn add(a: u64, b: u64, what: &'static str) -> Result<u64, AccountingError> {
    a.checked_add(b).ok_or(AccountingError::Overflow { what })
}

/// Python `round(x)` on a float: ties to even.
pub(super) fn py_round(x: f64) -> f64 {
    x.round_ties_even()
}

/// The zero-side check every family starts with.
pub(super) fn nonzero(width: u32, height: u32) -> Result<(), AccountingError> {
    if width == 0 || height == 0 {
        return Err(AccountingError::ZeroSize { width, height });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_rounding_is_ties_to_even() {
        assert_eq!(py_round(2.5), 2.0);
        assert_eq!(py_round(12.5), 12.0);
        assert_eq!(py_round(13.5), 14.0);
        assert_eq!(py_round(70.0 / 28.0), 2.0);
    }

    #[test]
    fn conversions_refuse_inexact_or_negative_values() {
        assert!(exact(EXACT_F64 + 1, "x").is_err());
        assert_eq!(exact(EXACT_F64, "x"), Ok(EXACT_F64 as f64));
        assert!(to_u64(-1.0, "x").is_err());
        assert!(to_u64(f64::NAN, "x").is_err());
        assert!(to_u64(f64::INFINITY, "x").is_err());
        assert_eq!(to_u64(7.9, "x"), Ok(7));
        assert!(to_u32(u64::from(u32::MAX) + 1, "x").is_err());
        assert!(mul(u64::MAX, 2, "x").is_err());
        assert!(add(u64::MAX, 1, "x").is_err());
    }

    #[test]
    fn zero_sides_are_rejected() {
        assert_eq!(nonzero(0, 5).map_err(|e| e.label()), Err("zero_size"));
        assert_eq!(nonzero(5, 0).map_err(|e| e.label()), Err("zero_size"));
        assert!(nonzero(1, 1).is_ok());
    }
}
