//! A pool's model tokenizer on the request path: exact prompt tokens and engine-matching
//! block hashes replace the parser's estimate (see [`pronto_tokenizer`]).
//!
//! Small prompts are tokenized on the proxy thread; prompts over
//! [`INLINE_MAX_BYTES`] on tokio's blocking pool, so a long document never stalls the other
//! requests of a proxy thread. Any failure keeps the estimate (the engine decides what it
//! accepts) and is counted in `pronto_tokenize_total{pool,result}`.

use std::sync::Arc;

use bytes::Bytes;

use crate::state::Pool;
use crate::telemetry::Metrics;
use pronto_core::request::{Endpoint, RequestFeatures};
use pronto_core::tokens::{block_hashes, TokenId, BLOCK_TOKENS};
use pronto_tokenizer::TokenizeError;
use pronto_tokenizer::INLINE_MAX_BYTES;

/// Whether two pools count tokens alike (same tokenizer object, or both the estimate).
pub(super) fn same_tokenizer(a: &Pool, b: &Pool) -> bool {
    match (&a.tokenizer, &b.tokenizer) {
        (Some(x), Some(y)) => Arc::ptr_eq(x, y),
        (None, None) => true,
        _ => false,
    }
}

/// Replace `features`' token count and block hashes by `pool`'s tokenizer's, if it has one.
pub(super) async fn apply(
    pool: &Pool,
    endpoint: Endpoint,
    body: &Bytes,
    features: &mut RequestFeatures,
    metrics: &Metrics,
) {
    let Some(tok) = &pool.tokenizer else { return };
    let result = if body.len() <= INLINE_MAX_BYTES {
        tok.prompt_ids(endpoint, body)
    } else {
        let (tok, body) = (Arc::clone(tok), body.clone());
        tokio::task::spawn_blocking(move || tok.prompt_ids(endpoint, &body))
            .await
            .unwrap_or_else(|e| Err(TokenizeError::Encode(format!("tokenizer task: {e}"))))
    };
    let label = match result {
        Ok(Some(ids)) => {
            set_ids(features, &ids);
            "exact"
        }
        Ok(None) => "skipped",
        Err(e) => {
            tracing::debug!(pool = %pool.model, error = %e, "tokenizer failed; keeping the estimate");
            e.label()
        }
    };
    metrics
        .tokenize_total
        .with_label_values(&[&pool.model, label])
        .inc();
}

fn set_ids(features: &mut RequestFeatures, ids: &[TokenId]) {
    features.prompt_tokens = u32::try_from(ids.len()).unwrap_or(u32::MAX);
    let routed = ids
        .len()
        .min(super::lifecycle::MAX_ROUTED_BLOCKS * BLOCK_TOKENS);
    features.block_hashes = block_hashes(&ids[..routed], BLOCK_TOKENS);
}
