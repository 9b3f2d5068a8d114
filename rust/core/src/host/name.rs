//! How tasks find their service: an abstract Unix socket named after the user and the
//! service's name (no file anywhere; one namespace per network namespace, so the executors of
//! one host and network namespace find the same service).

use crate::base::error::{Error, Result};

/// Longest service name (an abstract socket name has at most 107 bytes).
pub const MAX_NAME_LEN: usize = 64;

/// Checks a service name: 1 to [`MAX_NAME_LEN`] characters of `A-Z a-z 0-9 . _ -`.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "a host service name is 1 to {MAX_NAME_LEN} characters of A-Z, a-z, 0-9, '.', '_' and '-', got {name:?}"
        )))
    }
}

/// The abstract socket the service `name` of this user listens on.
pub(crate) fn socket_name(name: &str) -> String {
    format!("\0creditflow-host-{}-{name}", rustix::process::getuid().as_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_carry_the_user() {
        assert!(check_name("app-20260101.x_1").is_ok());
        for bad in ["", "a/b", "a b", "é", &"x".repeat(MAX_NAME_LEN + 1)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        let uid = rustix::process::getuid().as_raw();
        assert_eq!(socket_name("a"), format!("\0creditflow-host-{uid}-a"));
        assert!(socket_name(&"x".repeat(MAX_NAME_LEN)).len() < 108);
    }
}
