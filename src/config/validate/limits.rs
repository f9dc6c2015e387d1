//! `limits:` as read (serde parsed the durations and sizes and filled the defaults): each
//! value's range, and the checks between fields.

use super::*;

impl Checker {
    pub(super) fn limits(&mut self, f: &ConfigFile) -> Limits {
        let l = f.limits.unwrap_or_default();
        let d = Limits::default();
        let mut limits = Limits {
            max_body_bytes: self.size_range(
                l.max_body_bytes,
                "limits.max_body_bytes",
                MIN_BODY_BYTES..=MAX_BODY_BYTES,
                d.max_body_bytes,
            ),
            ..l
        };
        if limits.keepalive_timeout.subsec_nanos() != 0 {
            self.error(
                "limits.keepalive_timeout",
                format!("must be whole seconds, got {:?}", limits.keepalive_timeout),
            );
            limits.keepalive_timeout = d.keepalive_timeout;
        }
        limits.min_send_rate = l
            .min_send_rate
            .map(|n| self.size_range(n, "limits.min_send_rate", 0..=MAX_BODY_BYTES, 0))
            .filter(|&n| n > 0);
        // Unset: the larger of its default and the body limit (`Limits::buffer_budget`).
        limits.max_buffered_bytes = Some(match l.max_buffered_bytes {
            None => limits.buffer_budget(),
            Some(n) => self.size_range(
                n,
                "limits.max_buffered_bytes",
                MIN_BODY_BYTES..=64 * MAX_BODY_BYTES,
                DEFAULT_MAX_BUFFERED_BYTES,
            ),
        });
        if limits.buffer_budget() < limits.max_body_bytes {
            self.error(
                "limits.max_buffered_bytes",
                format!(
                    "{} is less than limits.max_body_bytes ({}): the largest body could never \
                     be read",
                    format_size(limits.buffer_budget()),
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

    /// A size in `range`; `default` (and an error at `path`) when outside it.
    fn size_range(
        &mut self,
        n: u64,
        path: &str,
        range: std::ops::RangeInclusive<u64>,
        default: u64,
    ) -> u64 {
        if range.contains(&n) {
            return n;
        }
        self.error(
            path,
            format!(
                "must be between {} and {}, got {}",
                format_size(*range.start()),
                format_size(*range.end()),
                format_size(n)
            ),
        );
        default
    }
}
