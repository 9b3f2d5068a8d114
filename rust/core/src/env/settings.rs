//! Every setting of a `NetworkEnvironment`, described once: its name, its default as the
//! Python constructor writes it, its unit, whether it is keyword-only, and one line of docs.
//!
//! Everything else is generated from [`SETTINGS`] or checked against it by a test that fails
//! when they drift:
//!
//! | what | how |
//! |---|---|
//! | [`EnvConfig::default`](crate::EnvConfig) | this module's tests (every field is in the table or said not to be a setting) |
//! | the pyo3 constructor's signature (`rust/python/src/env.rs`) | `tests/test_settings.py` compares `inspect.signature` with the table |
//! | the `.pyi` stub's `__new__` and docstring | written by `scripts/gen_settings.py`, checked by `tests/test_settings.py` |
//! | the README's settings table | written by `scripts/gen_settings.py` (`make settings`), checked by `--check` |
//! | Spark's per-task `EnvSettings` | `tests/test_settings.py` (differences only where declared, with a reason) |
//!
//! `scripts/gen_settings.py` reads this file, not the built module, so keep each entry in the
//! literal form below (one `Setting { .. }` per setting, fields in this order, string
//! literals only). `creditflow._native.settings()` exposes the same table to Python.

/// What a setting's value measures; how the Python side accepts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A byte size: an int, or a string with a unit (`"64MiB"`).
    Bytes,
    /// Seconds, a non-negative float.
    Seconds,
    /// A number of segments (buffers).
    Buffers,
    /// A count of something else (connections, channels, requests).
    Count,
    /// On or off.
    Flag,
    /// A `host:port` address.
    Address,
    /// One of a few strings.
    Choice,
    /// A shared secret (bytes or str).
    Secret,
    /// A `TLSConfig`.
    Tls,
    /// A filesystem path.
    Path,
}

impl Unit {
    /// The unit's name as docs and Python show it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Seconds => "seconds",
            Unit::Buffers => "buffers",
            Unit::Count => "count",
            Unit::Flag => "flag",
            Unit::Address => "address",
            Unit::Choice => "choice",
            Unit::Secret => "secret",
            Unit::Tls => "TLSConfig",
            Unit::Path => "path",
        }
    }
}

/// One setting of `NetworkEnvironment(...)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The keyword argument's name.
    pub name: &'static str,
    /// The parameter's Python type annotation (as the stub writes it).
    pub py_type: &'static str,
    /// The constructor's default, as a Python literal (`None`, `0.1`, `"credit"`, `True`).
    pub default: &'static str,
    /// What a `None` default stands for, as a Python literal (`"64MiB"`), when it stands for
    /// a value rather than for "none"; docs show this one.
    pub means: Option<&'static str>,
    /// What the value measures.
    pub unit: Unit,
    /// Whether the parameter is keyword-only (after `*`).
    pub keyword_only: bool,
    /// One line of docs (Markdown: code in backticks).
    pub doc: &'static str,
}

impl Setting {
    /// The default as docs show it: [`Setting::means`] if set, else [`Setting::default`].
    pub fn shown_default(&self) -> &'static str {
        self.means.unwrap_or(self.default)
    }
}

/// Every setting, in the constructor's parameter order.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "memory",
        py_type: "int | str | None",
        default: "None",
        means: Some("\"64MiB\""),
        unit: Unit::Bytes,
        keyword_only: false,
        doc: "network memory; the global pool holds `memory // segment_size` segments, allocated lazily, never more",
    },
    Setting {
        name: "segment_size",
        py_type: "int | str | None",
        default: "None",
        means: Some("\"32KiB\""),
        unit: Unit::Bytes,
        keyword_only: false,
        doc: "bytes per segment (a power of two of at least 4 KiB); larger segments cut per-buffer overhead for bulk transfers",
    },
    Setting {
        name: "bind",
        py_type: "str",
        default: "\"127.0.0.1:0\"",
        means: None,
        unit: Unit::Address,
        keyword_only: false,
        doc: "listen address (port 0: ephemeral); a non-loopback bind needs a `secret`, mutual `tls` or `insecure=True`",
    },
    Setting {
        name: "secret",
        py_type: "bytes | str | None",
        default: "None",
        means: None,
        unit: Unit::Secret,
        keyword_only: false,
        doc: "shared secret: peers prove knowledge of it (HMAC challenge-response) before any other message",
    },
    Setting {
        name: "flow_control",
        py_type: "str",
        default: "\"credit\"",
        means: None,
        unit: Unit::Choice,
        keyword_only: false,
        doc: "`\"credit\"` (Flink's credit-based flow control) or `\"tcp\"` (the pre-credit design, for teaching and comparison: one slow channel stalls its whole connection)",
    },
    Setting {
        name: "buffer_timeout",
        py_type: "float",
        default: "0.1",
        means: None,
        unit: Unit::Seconds,
        keyword_only: false,
        doc: "seconds until a partly filled buffer becomes readable; `0` = on every write",
    },
    Setting {
        name: "exclusive_buffers",
        py_type: "int",
        default: "2",
        means: None,
        unit: Unit::Buffers,
        keyword_only: false,
        doc: "credit per remote channel: buffers each remote channel of a gate owns",
    },
    Setting {
        name: "floating_buffers",
        py_type: "int",
        default: "8",
        means: None,
        unit: Unit::Buffers,
        keyword_only: false,
        doc: "credit per gate: buffers a gate lends to whichever of its channels has the largest backlog",
    },
    Setting {
        name: "insecure",
        py_type: "bool",
        default: "False",
        means: None,
        unit: Unit::Flag,
        keyword_only: true,
        doc: "allow a non-loopback `bind` without a `secret` or mutual TLS (anyone who reaches it can read the data)",
    },
    Setting {
        name: "local_handoff",
        py_type: "bool",
        default: "True",
        means: None,
        unit: Unit::Flag,
        keyword_only: true,
        doc: "hand batches to in-process readers without serializing; `False` = serialize into segments as for a remote reader",
    },
    Setting {
        name: "request_backoff_initial",
        py_type: "float",
        default: "0.1",
        means: None,
        unit: Unit::Seconds,
        keyword_only: true,
        doc: "first retry delay of a request for a partition the producer has not registered yet",
    },
    Setting {
        name: "request_backoff_max",
        py_type: "float",
        default: "10.0",
        means: None,
        unit: Unit::Seconds,
        keyword_only: true,
        doc: "largest retry delay; when a retry at it fails, the channel raises `PartitionNotFoundError`",
    },
    Setting {
        name: "advertise",
        py_type: "str | None",
        default: "None",
        means: None,
        unit: Unit::Address,
        keyword_only: true,
        doc: "the `host[:port]` peers should use, when it is not the bound address (NAT, containers)",
    },
    Setting {
        name: "handshake_timeout",
        py_type: "float",
        default: "10.0",
        means: None,
        unit: Unit::Seconds,
        keyword_only: true,
        doc: "seconds a peer may take to connect and prove itself; a silent peer is dropped after it",
    },
    Setting {
        name: "max_connections",
        py_type: "int",
        default: "512",
        means: None,
        unit: Unit::Count,
        keyword_only: true,
        doc: "connections this environment serves at once (handshakes included); one more is refused with `LimitExceededError`",
    },
    Setting {
        name: "max_channels_per_connection",
        py_type: "int",
        default: "16384",
        means: None,
        unit: Unit::Count,
        keyword_only: true,
        doc: "channels (partition requests) one connection may read at once; one more fails with `LimitExceededError`",
    },
    Setting {
        name: "max_outstanding_requests",
        py_type: "int",
        default: "4096",
        means: None,
        unit: Unit::Count,
        keyword_only: true,
        doc: "answers queued for a peer that sends requests but does not read them; past it the connection is closed",
    },
    Setting {
        name: "tls",
        py_type: "TLSConfig | None",
        default: "None",
        means: None,
        unit: Unit::Tls,
        keyword_only: true,
        doc: "`TLSConfig(cert=..., key=..., ca=...)`: TLS on every connection (plaintext and TLS peers refuse each other)",
    },
    Setting {
        name: "peer_timeout",
        py_type: "float",
        default: "30.0",
        means: None,
        unit: Unit::Seconds,
        keyword_only: true,
        doc: "seconds a peer may acknowledge nothing (cut link, vanished host) before its connections fail with `ConnectionLostError`; `0` = OS defaults (minutes)",
    },
    Setting {
        name: "overdraft_buffers",
        py_type: "int",
        default: "5",
        means: None,
        unit: Unit::Buffers,
        keyword_only: true,
        doc: "segments a partition may borrow beyond its share to finish a record it has started instead of stalling mid-record; out-pool usage can exceed 100% meanwhile (Flink's overdraft buffers; `0` = off)",
    },
    Setting {
        name: "debloat",
        py_type: "bool",
        default: "False",
        means: None,
        unit: Unit::Flag,
        keyword_only: true,
        doc: "buffer debloating (Flink's FLIP-183): every gate has its producers cut buffers so its buffers in flight drain in `debloat_target`",
    },
    Setting {
        name: "debloat_target",
        py_type: "float",
        default: "1.0",
        means: None,
        unit: Unit::Seconds,
        keyword_only: true,
        doc: "seconds the data in flight to a gate should take to drain (buffer debloating)",
    },
    Setting {
        name: "debloat_min_buffer",
        py_type: "int",
        default: "256",
        means: None,
        unit: Unit::Bytes,
        keyword_only: true,
        doc: "smallest buffer size buffer debloating announces, in bytes",
    },
    Setting {
        name: "spill_dir",
        py_type: "str | os.PathLike[str] | None",
        default: "None",
        means: None,
        unit: Unit::Path,
        keyword_only: true,
        doc: "where blocking and hybrid partitions spill: the environment makes its own subdirectory there and removes the ones of dead processes; `None` = `creditflow-spill` in the system temp dir",
    },
    Setting {
        name: "max_spill",
        py_type: "int | str | None",
        default: "None",
        means: None,
        unit: Unit::Bytes,
        keyword_only: true,
        doc: "bytes the environment's spill files may hold together; `None` = unbounded. At the cap a hybrid partition without replay backpressures, other spillable partitions fail with `SpillError`",
    },
    Setting {
        name: "wire_compression",
        py_type: "str | None",
        default: "None",
        means: None,
        unit: Unit::Choice,
        keyword_only: true,
        doc: "Arrow IPC body compression (`\"lz4\"` or `\"zstd\"`) of the batches this environment serializes for readers (remote, or local with `local_handoff=False`): pays on slow links, costs CPU on fast ones; `None` = uncompressed",
    },
    Setting {
        name: "shared_memory",
        py_type: "bool",
        default: "True",
        means: None,
        unit: Unit::Flag,
        keyword_only: true,
        doc: "carry a connection's frames through shared memory instead of TCP when both environments offer it and run on one host as one user (Linux); the TCP handshake still authenticates. `False` here or on the peer: TCP",
    },
];

/// The setting called `name`.
pub fn setting(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::{Setting, Unit, SETTINGS};
    use crate::{EnvConfig, FlowControl};

    /// A default's value, compared across the table and `EnvConfig::default()`.
    #[derive(Debug, Clone, PartialEq)]
    enum Value {
        None,
        Bool(bool),
        Int(u64),
        Seconds(Duration),
        Str(String),
    }

    /// Settings checked on the Python side only: not part of `EnvConfig`.
    const PYTHON_ONLY: &[(&str, &str)] = &[(
        "insecure",
        "the non-loopback-bind check is the bindings' (EnvConfig has a secret or not)",
    )];

    /// The Python literal `text` of setting `s`, as the value `EnvConfig` holds.
    fn parse(s: &Setting, text: &str) -> Value {
        let text = text.trim();
        let string = text
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .map(str::to_string);
        match (text, s.unit) {
            ("None", _) => Value::None,
            ("True", Unit::Flag) => Value::Bool(true),
            ("False", Unit::Flag) => Value::Bool(false),
            (_, Unit::Bytes) => {
                let n = match &string {
                    Some(t) => crate::base::units::parse_bytes(t).expect("a byte size"),
                    None => text.parse().expect("an int"),
                };
                Value::Int(n as u64)
            }
            (_, Unit::Seconds) => {
                assert!(
                    text.contains('.'),
                    "{}: seconds are written as a float, got {text}",
                    s.name
                );
                Value::Seconds(Duration::from_secs_f64(text.parse().expect("a float")))
            }
            (_, Unit::Buffers | Unit::Count) => Value::Int(text.parse().expect("an int")),
            (_, Unit::Address | Unit::Choice) => Value::Str(string.expect("a string literal")),
            _ => panic!("{}: cannot read default {text}", s.name),
        }
    }

    /// Every field of `EnvConfig::default()` the constructor sets, by setting name. The
    /// destructuring is exhaustive: a new field does not compile until it is listed here
    /// (and in SETTINGS) or said not to be a setting.
    fn config_defaults() -> BTreeMap<&'static str, Value> {
        let EnvConfig {
            memory,
            segment_size,
            bind,
            buffer_timeout,
            exclusive_buffers,
            floating_buffers,
            flow_control,
            local_handoff,
            request_backoff,
            max_record_size: _, // not a setting: a reader's record cap, fixed at 2 GiB
            secret,
            handshake_timeout,
            advertise,
            overdraft_buffers,
            limits,
            tls,
            peer_timeout,
            debloat,
            debloat_target,
            debloat_min_buffer,
            spill_dir,
            max_spill,
            wire_compression,
            shared_memory,
        } = EnvConfig::default();
        let crate::base::config::Limits {
            max_connections,
            max_channels_per_connection,
            max_outstanding_requests,
        } = limits;
        let crate::base::config::Backoff { initial, max } = request_backoff;
        let int = |n: usize| Value::Int(n as u64);
        let opt = |o: Option<String>| o.map_or(Value::None, Value::Str);
        let set = |given: bool| {
            if given {
                Value::Str("<set>".into())
            } else {
                Value::None
            }
        };
        BTreeMap::from([
            ("memory", int(memory)),
            ("segment_size", int(segment_size)),
            ("bind", Value::Str(bind)),
            ("secret", set(secret.is_some())),
            (
                "flow_control",
                Value::Str(
                    match flow_control {
                        FlowControl::Credit => "credit",
                        FlowControl::Tcp => "tcp",
                    }
                    .into(),
                ),
            ),
            ("buffer_timeout", Value::Seconds(buffer_timeout)),
            ("exclusive_buffers", int(exclusive_buffers)),
            ("floating_buffers", int(floating_buffers)),
            ("local_handoff", Value::Bool(local_handoff)),
            ("request_backoff_initial", Value::Seconds(initial)),
            ("request_backoff_max", Value::Seconds(max)),
            ("advertise", opt(advertise)),
            ("handshake_timeout", Value::Seconds(handshake_timeout)),
            ("max_connections", int(max_connections)),
            ("max_channels_per_connection", int(max_channels_per_connection)),
            ("max_outstanding_requests", int(max_outstanding_requests)),
            ("tls", set(tls.is_some())),
            ("peer_timeout", Value::Seconds(peer_timeout)),
            ("overdraft_buffers", int(overdraft_buffers)),
            ("debloat", Value::Bool(debloat)),
            ("debloat_target", Value::Seconds(debloat_target)),
            ("debloat_min_buffer", int(debloat_min_buffer)),
            ("spill_dir", opt(spill_dir.map(|p| p.display().to_string()))),
            ("max_spill", max_spill.map_or(Value::None, Value::Int)),
            (
                "wire_compression",
                wire_compression.map_or(Value::None, |c| Value::Str(c.name().into())),
            ),
            ("shared_memory", Value::Bool(shared_memory)),
        ])
    }

    #[test]
    fn the_table_defaults_are_env_config_defaults() {
        let config = config_defaults();
        for s in SETTINGS {
            if PYTHON_ONLY.iter().any(|(name, _)| *name == s.name) {
                continue;
            }
            let want = config
                .get(s.name)
                .unwrap_or_else(|| panic!("{} is in SETTINGS but not an EnvConfig field", s.name));
            assert_eq!(&parse(s, s.shown_default()), want, "default of {}", s.name);
        }
    }

    #[test]
    fn every_env_config_setting_is_in_the_table() {
        for name in config_defaults().keys() {
            assert!(
                super::setting(name).is_some(),
                "EnvConfig's {name} is not in SETTINGS"
            );
        }
        for (name, _) in PYTHON_ONLY {
            assert!(
                super::setting(name).is_some(),
                "{name} is listed as Python-only but not in SETTINGS"
            );
        }
    }

    #[test]
    fn the_table_is_well_formed() {
        let mut seen = std::collections::HashSet::new();
        let mut keyword_only = false;
        for s in SETTINGS {
            assert!(seen.insert(s.name), "{} twice", s.name);
            assert!(
                !keyword_only || s.keyword_only,
                "{}: positional after keyword-only",
                s.name
            );
            keyword_only = s.keyword_only;
            assert!(
                !s.doc.is_empty() && !s.doc.contains('\n'),
                "{}: one line of docs",
                s.name
            );
            assert!(
                s.means.is_none() || s.default == "None",
                "{}: `means` is for None defaults",
                s.name
            );
        }
    }
}
