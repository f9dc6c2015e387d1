//! `limits:`: sizes, deadlines and capacity caps of the edge, each with its default and range.

use super::*;

impl Checker {
    pub(super) fn limits(&mut self, f: &ConfigFile) -> Limits {
        let l = f.limits.clone().unwrap_or_default();
        let max_body_bytes = match &l.max_body_bytes {
            None => DEFAULT_MAX_BODY_BYTES,
            Some(q) => self.size(
                q,
                "limits.max_body_bytes",
                MIN_BODY_BYTES,
                MAX_BODY_BYTES,
                DEFAULT_MAX_BODY_BYTES,
            ),
        };
        let limits = Limits {
            max_body_bytes,
            connect_timeout: self.duration(
                l.connect_timeout.as_ref(),
                "limits.connect_timeout",
                DEFAULT_CONNECT_TIMEOUT,
            ),
            first_token_timeout: self.duration(
                l.first_token_timeout.as_ref(),
                "limits.first_token_timeout",
                DEFAULT_FIRST_TOKEN_TIMEOUT,
            ),
            idle_timeout: self.duration(
                l.idle_timeout.as_ref(),
                "limits.idle_timeout",
                DEFAULT_IDLE_TIMEOUT,
            ),
            request_timeout: self.duration(
                l.request_timeout.as_ref(),
                "limits.request_timeout",
                DEFAULT_REQUEST_TIMEOUT,
            ),
            header_timeout: self.duration(
                l.header_timeout.as_ref(),
                "limits.header_timeout",
                DEFAULT_HEADER_TIMEOUT,
            ),
            body_timeout: self.duration(
                l.body_timeout.as_ref(),
                "limits.body_timeout",
                DEFAULT_BODY_TIMEOUT,
            ),
            write_timeout: self.duration(
                l.write_timeout.as_ref(),
                "limits.write_timeout",
                DEFAULT_WRITE_TIMEOUT,
            ),
            keepalive_timeout: self.whole_seconds(
                l.keepalive_timeout.as_ref(),
                "limits.keepalive_timeout",
                DEFAULT_KEEPALIVE_TIMEOUT,
            ),
            min_send_rate: l
                .min_send_rate
                .as_ref()
                .map(|q| self.size(q, "limits.min_send_rate", 0, MAX_BODY_BYTES, 0))
                .filter(|&n| n > 0),
            max_buffered_bytes: match &l.max_buffered_bytes {
                None => DEFAULT_MAX_BUFFERED_BYTES.max(max_body_bytes),
                Some(q) => self.size(
                    q,
                    "limits.max_buffered_bytes",
                    MIN_BODY_BYTES,
                    64 * MAX_BODY_BYTES,
                    DEFAULT_MAX_BUFFERED_BYTES,
                ),
            },
            max_connections: match l.max_connections {
                None => DEFAULT_MAX_CONNECTIONS,
                Some(n) if (1..=1_000_000).contains(&n) => n,
                Some(n) => {
                    self.error(
                        "limits.max_connections",
                        format!("must be between 1 and 1000000, got {n}"),
                    );
                    DEFAULT_MAX_CONNECTIONS
                }
            },
        };
        if limits.max_buffered_bytes < limits.max_body_bytes {
            self.error(
                "limits.max_buffered_bytes",
                format!(
                    "{} is less than limits.max_body_bytes ({}): the largest body could never \
                     be read",
                    format_size(limits.max_buffered_bytes),
                    format_size(limits.max_body_bytes)
                ),
            );
        }
        if limits.first_token_timeout < limits.connect_timeout {
            self.warn(
                "limits.first_token_timeout",
                format!(
                    "{:?} is shorter than limits.connect_timeout ({:?}): a slow connect alone \
                     can exhaust it",
                    limits.first_token_timeout, limits.connect_timeout
                ),
            );
        }
        limits
    }
}
