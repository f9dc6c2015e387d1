//! OpenAI request bodies → [`RequestFeatures`].

mod features;

pub use features::{Endpoint, RequestFeatures};
