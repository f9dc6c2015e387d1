//! The stream migration family (`src/proxy/migrate.rs`), registered with the others; every
//! outcome's series starts at zero.

use prometheus::IntCounterVec;

use super::{counter, Families};

/// How a stream whose backend failed mid-answer went on (the `outcome` label of
/// `pronto_stream_migrations_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationOutcome {
    /// A continuation on another backend completed the stream.
    Continued,
    /// The answer was whole already (a finish was relayed): the gateway ended the stream.
    Finished,
    /// The stream could not be continued honestly (`n` > 1, logprobs, a tool call or
    /// reasoning in progress, no budget left, migration off for the route or pool): it ended
    /// with an error event.
    NotContinuable,
    /// Every continuation allowed failed, or no backend was left: an error event.
    Failed,
}

impl MigrationOutcome {
    /// Every outcome.
    pub const ALL: [MigrationOutcome; 4] = [
        MigrationOutcome::Continued,
        MigrationOutcome::Finished,
        MigrationOutcome::NotContinuable,
        MigrationOutcome::Failed,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            MigrationOutcome::Continued => "continued",
            MigrationOutcome::Finished => "finished",
            MigrationOutcome::NotContinuable => "not_continuable",
            MigrationOutcome::Failed => "failed",
        }
    }
}

/// `pronto_stream_migrations_total{outcome}`: streams whose backend failed after the first
/// token, by how they went on; and `pronto_stream_migration_reprefill_tokens_total`: prompt
/// tokens the continuations sent (the prompt and the text so far: prefill paid again).
#[derive(Debug, Clone)]
pub struct MigrationMetrics {
    /// By outcome.
    pub migrations_total: IntCounterVec,
    /// Prompt tokens of the continuations sent.
    pub reprefill_tokens_total: IntCounterVec,
}

impl MigrationMetrics {
    pub(super) fn new(r: &Families) -> MigrationMetrics {
        let m = MigrationMetrics {
            migrations_total: counter(
                r,
                "pronto_stream_migrations_total",
                "Streams whose backend failed after the first token, by how they went on",
                &["outcome"],
            ),
            reprefill_tokens_total: counter(
                r,
                "pronto_stream_migration_reprefill_tokens_total",
                "Prompt tokens (the prompt and the text so far) sent to continue migrated streams, by pool",
                &["pool"],
            ),
        };
        for o in MigrationOutcome::ALL {
            m.migrations_total.with_label_values(&[o.label()]);
        }
        m
    }

    /// Count one stream's outcome.
    pub fn count(&self, outcome: MigrationOutcome) {
        self.migrations_total
            .with_label_values(&[outcome.label()])
            .inc();
    }
}
