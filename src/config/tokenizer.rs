//! A pool's `tokenizer:` / `chat_template:` (the model's own tokenizer, see
//! [`pronto_tokenizer`]; `tiktoken:<name>` for an OpenAI encoding): loaded at
//! validation, so a missing or broken file, or an unknown encoding, is a located error and an
//! invalid config never replaces a working one. Relative paths were resolved against the
//! config file's directory beforehand ([`super::tls::resolve_paths`]; a `tiktoken:` value is
//! not a path).

use std::path::Path;
use std::sync::Arc;

use super::file::PoolFile;
use super::model::TokenizerRef;
use super::validate::Checker;
use pronto_tokenizer::ModelTokenizer;

impl Checker {
    /// A pool's `tokenizer` (and `chat_template`), loaded into the resources under `model`;
    /// `None` when absent or invalid (errors recorded at the field that is wrong).
    pub(super) fn tokenizer(
        &mut self,
        path: &str,
        model: &str,
        pool: &PoolFile,
    ) -> Option<TokenizerRef> {
        let Some(file) = pool.tokenizer.as_deref() else {
            if pool.chat_template.is_some() {
                self.error(
                    format!("{path}.chat_template"),
                    "needs `tokenizer` (the template renders prompts for that tokenizer)",
                );
            }
            return None;
        };
        if let Some(t) = pool.chat_template.as_deref() {
            if !Path::new(t).is_file() {
                self.error(
                    format!("{path}.chat_template"),
                    format!("{t} is not a file"),
                );
                return None;
            }
        }
        match ModelTokenizer::from_spec(file, pool.chat_template.as_deref().map(Path::new)) {
            Ok(t) => {
                if !t.has_chat_template() {
                    self.warn(
                        format!("{path}.tokenizer"),
                        "no chat template found beside it (chat_template.jinja or \
                         tokenizer_config.json); chat requests keep the estimated tokens",
                    );
                }
                let r = TokenizerRef {
                    path: t.path().to_path_buf(),
                    chat_template: t.chat_template_file().map(Path::to_path_buf),
                    fingerprint: t.fingerprint(),
                };
                self.resources.add_tokenizer(model, Arc::new(t));
                Some(r)
            }
            Err(message) => {
                self.error(format!("{path}.tokenizer"), message);
                None
            }
        }
    }
}
