//! OpenAI request bodies → [`RequestFeatures`].
//!
//! [`parse_request`] reads a chat, completions or embeddings body once, borrowing from it, and
//! builds the canonical prompt, its token estimate and its prefix block hashes.

mod features;
mod json_str;
mod parse;
mod token_ratio;

pub use features::{Endpoint, RequestFeatures};
pub use parse::{parse_request, parse_request_with_prompt, RequestError};
pub use token_ratio::TokenRatio;
