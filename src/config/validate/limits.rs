//! `limits:` as read (serde parsed the durations and sizes, checked their ranges and filled
//! the defaults): the defaults that depend on another field, and the checks between fields.

use super::*;

impl Checker {
    pub(super) fn limits(&mut self, f: &ConfigFile) -> Limits {
        let l = f.limits.unwrap_or_default();
        let mut limits = Limits {
            // 0: no minimum.
            min_send_rate: l.min_send_rate.filter(|&n| n > 0),
            ..l
        };
        // Unset: the larger of its default and the body limit (`Limits::buffer_budget`).
        limits.max_buffered_bytes = Some(limits.buffer_budget());
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
}
