//! A process the service watches (an executor it serves for, a task it handed pieces to), by
//! pid and start time, so that a reused pid is not taken for it.

/// A process, as it was when first seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Process {
    pid: u32,
    start: Option<u64>,
}

impl Process {
    /// Process `pid` as it is now.
    pub(crate) fn of(pid: u32) -> Process {
        Process {
            pid,
            start: start_time(pid),
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether it still runs (a process with its pid and a later start time is another).
    pub(crate) fn alive(&self) -> bool {
        match start_time(self.pid) {
            None => false,
            Some(t) => self.start.is_none_or(|s| s == t),
        }
    }
}

/// A process's start time (field 22 of `/proc/<pid>/stat`), `None` when it is gone.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after its end.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}
