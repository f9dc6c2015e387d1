//! What the router knows about a request before choosing a backend.

use crate::tokens::BlockHash;

/// Which OpenAI endpoint a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/embeddings`
    Embeddings,
}

impl Endpoint {
    /// The request path of this endpoint.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
        }
    }

    /// The endpoint served at `path`, if any.
    pub fn from_path(path: &str) -> Option<Endpoint> {
        match path {
            "/v1/chat/completions" => Some(Endpoint::ChatCompletions),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/embeddings" => Some(Endpoint::Embeddings),
            _ => None,
        }
    }
}

/// Everything routing needs to know about one request, parsed once from its body.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestFeatures {
    /// The endpoint the request was sent to.
    pub endpoint: Endpoint,
    /// The `model` field.
    pub model: String,
    /// Where the `model` field's JSON string literal (quotes included) lies in the body, so
    /// a gateway can send another name without serializing the body again; `None` when the
    /// features were not parsed from a body.
    pub model_span: Option<std::ops::Range<usize>>,
    /// The `stream` field (false when absent).
    pub stream: bool,
    /// Whether the client itself asked for `stream_options.include_usage`.
    pub include_usage: bool,
    /// The canonical prompt: chat messages in order as `role: text\n` (text parts of multi-part
    /// content concatenated), or the completions / embeddings input (strings joined by `\n`).
    /// Empty unless parsed with [`super::parse_request_with_prompt`].
    pub prompt: String,
    /// Estimated prompt tokens (see [`crate::tokens`]).
    pub prompt_tokens: u32,
    /// `max_completion_tokens` or `max_tokens`, if given.
    pub max_tokens: Option<u32>,
    /// Session key for affinity: the `x-session-id` header, else the `user` field.
    pub session_key: Option<String>,
    /// Chained hashes of every full [`crate::tokens::BLOCK_TOKENS`]-token block of the prompt.
    pub block_hashes: Vec<BlockHash>,
    /// The matched route's objectives (`ttft_slo`, `tpot_slo`): not in the body, set by the
    /// gateway once the route is known; none until then.
    pub slo: crate::slo::SloTargets,
    /// The `reasoning_effort` field (chat completions), when it names a known level.
    pub reasoning_effort: Option<crate::predict::ReasoningEffort>,
    /// What the matched route's policy minimises (`objective:`), with the pool's expected
    /// reasoning length for `ttfa`: set by the gateway once the route is known.
    pub objective: crate::slo::Objective,
}

impl RequestFeatures {
    /// A features value for tests and the offline evaluator: a chat request with the given
    /// prompt, its tokens and blocks computed as the parser would.
    pub fn synthetic(model: &str, prompt: String, max_tokens: Option<u32>) -> RequestFeatures {
        let (n, hashes) =
            crate::tokens::text_block_hashes(prompt.as_bytes(), crate::tokens::BLOCK_TOKENS);
        RequestFeatures {
            endpoint: Endpoint::ChatCompletions,
            model: model.to_string(),
            model_span: None,
            stream: true,
            include_usage: false,
            prompt,
            prompt_tokens: n as u32,
            max_tokens,
            session_key: None,
            block_hashes: hashes,
            slo: crate::slo::SloTargets::default(),
            reasoning_effort: None,
            objective: crate::slo::Objective::Ttft,
        }
    }
}
