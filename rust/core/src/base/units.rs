//! Byte sizes written as `"64MiB"`, `"32 KiB"`, `"1g"` or plain integers.

use crate::base::error::{Error, Result};

/// Parses a byte size: an integer with an optional unit (B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB).
/// Decimal units (KB) are powers of 1000, binary units (KiB, K) powers of 1024.
///
/// ```
/// use creditflow_core::base::units::parse_bytes;
///
/// assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
/// assert_eq!(parse_bytes("32 KiB").unwrap(), 32 * 1024);
/// assert_eq!(parse_bytes("1.5k").unwrap(), 1536);
/// assert_eq!(parse_bytes("1MB").unwrap(), 1_000_000);
/// assert_eq!(parse_bytes("65_536").unwrap(), 65_536);
/// // Not a whole number of bytes, or no unit we know: an InvalidArgument naming the text.
/// assert!(parse_bytes("0.5B").unwrap_err().to_string().contains("\"0.5B\""));
/// assert!(parse_bytes("12 parsecs").is_err());
/// ```
pub fn parse_bytes(text: &str) -> Result<usize> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let num = num.replace('_', "");
    let value: f64 = num.parse().map_err(|_| {
        Error::InvalidArgument(format!(
            "invalid byte size {text:?}: expected e.g. 65536, \"64MiB\" or \"32KiB\""
        ))
    })?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        "t" | "tib" => 1024.0f64.powi(4),
        "tb" => 1e12,
        other => {
            return Err(Error::InvalidArgument(format!(
                "invalid byte size {text:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, KB, MB, GB)"
            )))
        }
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > usize::MAX as f64 || bytes.fract() != 0.0 {
        return Err(Error::InvalidArgument(format!(
            "invalid byte size {text:?}: not a whole number of bytes"
        )));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("32 KiB").unwrap(), 32 << 10);
        assert_eq!(parse_bytes("32k").unwrap(), 32 << 10);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("1MB").unwrap(), 1_000_000);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("1_024").unwrap(), 1024);
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "MiB", "12 parsecs", "-1", "0.5B", "1e3"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }
}
