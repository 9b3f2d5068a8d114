//! How long a blocking call may wait, and how it is interrupted.

use std::time::{Duration, Instant};

use crate::base::error::{Error, Result};

/// How often a blocked call wakes to run its interrupt check (Ctrl-C latency).
pub const CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// The limits of one blocking call: an optional deadline and an interrupt check run at
/// least every [`CHECK_INTERVAL`] while blocked. The check returns `Err` to abort the wait.
pub struct Wait<'a> {
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    what: &'static str,
    check: Option<&'a mut dyn FnMut() -> Result<()>>,
    /// When the check last ran (it may take the GIL: not on every tick).
    last_check: Option<Instant>,
}

impl<'a> Wait<'a> {
    /// Waits without limit and without interrupt check (tests, internal threads).
    pub fn forever() -> Wait<'static> {
        Wait {
            deadline: None,
            timeout: None,
            what: "",
            check: None,
            last_check: None,
        }
    }

    /// Waits at most `timeout` (None: without limit); `what` names the wait in the error.
    pub fn timeout(timeout: Option<Duration>, what: &'static str) -> Wait<'static> {
        Wait {
            deadline: timeout.map(|t| Instant::now() + t),
            timeout,
            what,
            check: None,
            last_check: None,
        }
    }

    /// Adds an interrupt check.
    pub fn with_check<'b>(self, check: &'b mut dyn FnMut() -> Result<()>) -> Wait<'b>
    where
        'a: 'b,
    {
        Wait {
            deadline: self.deadline,
            timeout: self.timeout,
            what: self.what,
            check: Some(check),
            last_check: None,
        }
    }

    /// Time left before the deadline (`None`: no deadline; zero once it passed).
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// How long the caller may sleep now before calling [`Wait::tick`] again; `Err` when the
    /// deadline has passed or the check failed. The check runs on the first tick and then at
    /// most every [`CHECK_INTERVAL`], however often the caller ticks.
    pub fn tick(&mut self) -> Result<Duration> {
        if let Some(check) = self.check.as_mut() {
            let now = Instant::now();
            if self
                .last_check
                .is_none_or(|t| now.duration_since(t) >= CHECK_INTERVAL)
            {
                self.last_check = Some(now);
                check()?;
            }
        }
        let slice = if self.check.is_some() {
            CHECK_INTERVAL
        } else {
            Duration::from_secs(3600)
        };
        match self.deadline {
            None => Ok(slice),
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    Err(Error::Timeout(self.timeout.unwrap_or_default(), self.what))
                } else {
                    Ok(slice.min(deadline - now))
                }
            }
        }
    }
}
