//! OpenAI request bodies → [`RequestFeatures`].

mod features;
mod parse;

pub use features::{Endpoint, RequestFeatures};
pub use parse::{parse_request, RequestError};
