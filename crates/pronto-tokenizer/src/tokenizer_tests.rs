use std::collections::HashMap;

use super::*;
use pronto_core::tokens::{block_hashes, BLOCK_TOKENS};
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Special tokens first (ids 0..4), then `w0`…`w499` and a few words.
fn vocab() -> HashMap<String, u32> {
    let mut words: Vec<String> = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    words.extend((0..500).map(|i| format!("w{i}")));
    words.extend(
        [
            "system",
            "user",
            "assistant",
            "tool",
            "hello",
            "lookup",
            "q",
            "x",
            ":",
            "=",
            ".",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    words
        .into_iter()
        .enumerate()
        .map(|(i, w)| (w, i as u32))
        .collect()
}

/// A word-level tokenizer.json (BOS added to single sequences), written into `dir`.
fn write_tokenizer(dir: &Path) {
    let model = WordLevel::builder()
        .vocab(vocab().into_iter().collect())
        .unk_token("<unk>".into())
        .build()
        .unwrap();
    let mut t = Tokenizer::new(model);
    t.with_pre_tokenizer(Some(Whitespace {}));
    t.add_special_tokens(&[
        AddedToken::from("<s>", true),
        AddedToken::from("</s>", true),
        AddedToken::from("<|im_start|>", true),
        AddedToken::from("<|im_end|>", true),
    ]);
    t.with_post_processor(Some(
        TemplateProcessing::builder()
            .try_single("<s> $A")
            .unwrap()
            .special_tokens(vec![("<s>", 1)])
            .build()
            .unwrap(),
    ));
    std::fs::write(dir.join("tokenizer.json"), t.to_string(false).unwrap()).unwrap();
}

fn model_dir(config: serde_json::Value) -> tempfile_dir::Dir {
    let d = tempfile_dir::Dir::new();
    write_tokenizer(d.path());
    std::fs::write(d.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    d
}

/// A throwaway directory (no tempfile crate in the tree).
mod tempfile_dir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    pub struct Dir(PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "pronto-tok-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn chatml() -> (tempfile_dir::Dir, ModelTokenizer) {
    let d = model_dir(
        serde_json::json!({"bos_token": "<s>", "eos_token": {"content": "</s>"},
        "chat_template": CHATML}),
    );
    let t = ModelTokenizer::load(d.path(), None).unwrap();
    (d, t)
}

fn ids(t: &ModelTokenizer, endpoint: Endpoint, body: serde_json::Value) -> Option<Vec<u32>> {
    t.prompt_ids(endpoint, body.to_string().as_bytes()).unwrap()
}

fn word_ids(text: &str) -> Vec<u32> {
    let v = vocab();
    text.split_whitespace()
        .map(|w| *v.get(w).unwrap_or(&0))
        .collect()
}

#[test]
fn chat_is_rendered_with_the_template_then_encoded_without_bos() {
    let (_d, t) = chatml();
    assert!(t.has_chat_template());
    let got = ids(
        &t,
        Endpoint::ChatCompletions,
        serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": "w1 w2"},
            {"role": "user", "content": "w3"}]}),
    )
    .unwrap();
    let want = word_ids(
        "<|im_start|> system w1 w2 <|im_end|> <|im_start|> user w3 <|im_end|> <|im_start|> assistant",
    );
    assert_eq!(got, want);
    // Rendered text, exactly (trim_blocks: no newline after a block tag).
    let body = serde_json::json!({"messages": [{"role": "user", "content": "w3"}]}).to_string();
    let text = t
        .render_chat(t.chat.as_ref().unwrap(), body.as_bytes())
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nw3<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn generation_prompt_follows_the_request() {
    let (_d, t) = chatml();
    let msgs = serde_json::json!([{"role": "user", "content": "w3"}]);
    let with = ids(
        &t,
        Endpoint::ChatCompletions,
        serde_json::json!({"messages": msgs}),
    )
    .unwrap();
    let without = ids(
        &t,
        Endpoint::ChatCompletions,
        serde_json::json!({"messages": msgs, "add_generation_prompt": false}),
    )
    .unwrap();
    let continued = ids(
        &t,
        Endpoint::ChatCompletions,
        serde_json::json!({"messages": msgs, "continue_final_message": true}),
    )
    .unwrap();
    assert_eq!(with.len(), without.len() + 2);
    assert_eq!(&with[..without.len()], &without[..]);
    assert_eq!(continued, without);
}

#[test]
fn completions_get_bos_and_token_id_prompts_need_nothing() {
    let (_d, t) = chatml();
    let one = ids(
        &t,
        Endpoint::Completions,
        serde_json::json!({"prompt": "w5 w6"}),
    )
    .unwrap();
    assert_eq!(one, word_ids("<s> w5 w6"));
    let many = ids(
        &t,
        Endpoint::Completions,
        serde_json::json!({"prompt": ["w5", "w6 w7"]}),
    )
    .unwrap();
    assert_eq!(many, word_ids("<s> w5 <s> w6 w7"));
    assert_eq!(
        ids(
            &t,
            Endpoint::Completions,
            serde_json::json!({"prompt": [5, 6, 7]})
        ),
        None
    );
    assert_eq!(
        ids(&t, Endpoint::Embeddings, serde_json::json!({"input": "w9"})).unwrap(),
        word_ids("<s> w9")
    );
}

#[test]
fn content_parts_are_joined_and_tool_arguments_parsed() {
    let template = "{% for m in messages %}{{ m.role }} {{ m.content }}{% if m.tool_calls %} {{ m.tool_calls[0].function.name }} q = {{ m.tool_calls[0].function.arguments.q }}{% endif %} .\n{% endfor %}";
    let d = model_dir(serde_json::json!({"chat_template": template}));
    let t = ModelTokenizer::load(d.path(), None).unwrap();
    let got = ids(
        &t,
        Endpoint::ChatCompletions,
        serde_json::json!({"messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "w1"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
                {"type": "text", "text": "w2"}]},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "lookup", "arguments": "{\"q\": \"w7\"}"}}]}]}),
    )
    .unwrap();
    assert_eq!(got, word_ids("user w1 w2 . assistant lookup q = w7 ."));
}

#[test]
fn template_variables_specials_kwargs_and_tools() {
    let template = "{{ bos_token }}{% if tools %}tool {{ tools | length }} {% endif %}{% if x %}x {% endif %}{{ messages[0].content.strip() }}{{ eos_token }}";
    let d = model_dir(
        serde_json::json!({"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false},
        "chat_template": template}),
    );
    let t = ModelTokenizer::load(d.path(), None).unwrap();
    let got = ids(
        &t,
        Endpoint::ChatCompletions,
        serde_json::json!({"messages": [{"role": "user", "content": "  w4  "}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "chat_template_kwargs": {"x": true}}),
    )
    .unwrap();
    // "tool 1 " → `tool`, `1` (unknown: <unk>)
    assert_eq!(got, word_ids("<s> tool <unk> x w4 </s>"));
}

#[test]
fn a_template_that_raises_is_an_error_and_no_template_keeps_the_estimate() {
    let d = model_dir(serde_json::json!({
        "chat_template": "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}ok"}));
    let t = ModelTokenizer::load(d.path(), None).unwrap();
    let body = serde_json::json!({"messages": [{"role": "user", "content": "w1"}]}).to_string();
    let err = t
        .prompt_ids(Endpoint::ChatCompletions, body.as_bytes())
        .unwrap_err();
    assert_eq!(err.label(), "template");
    assert!(err.to_string().contains("system first"), "{err}");

    let bare = tempfile_dir::Dir::new();
    write_tokenizer(bare.path());
    let t = ModelTokenizer::load(&bare.path().join("tokenizer.json"), None).unwrap();
    assert!(!t.has_chat_template());
    assert_eq!(
        t.prompt_ids(Endpoint::ChatCompletions, body.as_bytes())
            .unwrap(),
        None
    );
    let err = t
        .prompt_ids(Endpoint::Completions, b"{\"prompt\": {}}")
        .unwrap_err();
    assert_eq!(err.label(), "body");
}

#[test]
fn where_the_template_comes_from() {
    // A list in tokenizer_config.json: the `default` one.
    let d = model_dir(serde_json::json!({"chat_template": [
        {"name": "tool_use", "template": "w1"}, {"name": "default", "template": "w2"}]}));
    let t = ModelTokenizer::load(d.path(), None).unwrap();
    let body = serde_json::json!({"messages": [{"role": "user", "content": "w0"}]}).to_string();
    let chat = |t: &ModelTokenizer| {
        t.prompt_ids(Endpoint::ChatCompletions, body.as_bytes())
            .unwrap()
            .unwrap()
    };
    assert_eq!(chat(&t), word_ids("w2"));
    // chat_template.jinja beside it wins over tokenizer_config.json …
    std::fs::write(d.path().join("chat_template.jinja"), "w3").unwrap();
    let t = ModelTokenizer::load(d.path(), None).unwrap();
    assert_eq!(chat(&t), word_ids("w3"));
    // … and the pool's chat_template wins over both.
    let own = d.path().join("own.jinja");
    std::fs::write(&own, "w4").unwrap();
    let t2 = ModelTokenizer::load(d.path(), Some(&own)).unwrap();
    assert_eq!(chat(&t2), word_ids("w4"));
    // Equality: same files → equal; a changed file → not.
    assert_eq!(t, ModelTokenizer::load(d.path(), None).unwrap());
    assert_ne!(t, t2);
    std::fs::write(d.path().join("chat_template.jinja"), "w5").unwrap();
    assert_ne!(t, ModelTokenizer::load(d.path(), None).unwrap());
}

#[test]
fn load_errors_name_the_file() {
    let d = tempfile_dir::Dir::new();
    let e = ModelTokenizer::load(d.path(), None).unwrap_err();
    assert!(
        e.contains("cannot read") && e.contains("tokenizer.json"),
        "{e}"
    );
    std::fs::write(d.path().join("tokenizer.json"), "{\"not\": 1}").unwrap();
    let e = ModelTokenizer::load(d.path(), None).unwrap_err();
    assert!(e.contains("is not a tokenizer.json"), "{e}");
    write_tokenizer(d.path());
    std::fs::write(d.path().join("chat_template.jinja"), "{% for m in %}").unwrap();
    let e = ModelTokenizer::load(d.path(), None).unwrap_err();
    assert!(e.contains("chat_template.jinja"), "{e}");
}

#[test]
fn a_shared_system_prompt_gives_shared_leading_blocks() {
    let (_d, t) = chatml();
    let system: String = (0..200).map(|i| format!("w{i} ")).collect();
    let chat = |user: &str| {
        let body = serde_json::json!({"messages": [
            {"role": "system", "content": system}, {"role": "user", "content": user}]});
        let ids = ids(&t, Endpoint::ChatCompletions, body).unwrap();
        block_hashes(&ids, BLOCK_TOKENS)
    };
    let a = chat("w300 w301");
    let b = chat(&"w400 ".repeat(40));
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    // 2 + 200 tokens of system turn: 12 full blocks in common, then they differ.
    assert_eq!(shared, 202 / BLOCK_TOKENS);
    assert!(b.len() > shared);
}

#[test]
fn strftime_now_formats_the_common_directives() {
    let s = strftime_now("%d %b %Y|%B|%m|%y|%%|%Q");
    let parts: Vec<&str> = s.split('|').collect();
    assert_eq!(parts.len(), 6, "{s}");
    assert_eq!(parts[0].len(), 11, "{s}");
    assert!(parts[2].parse::<u32>().is_ok_and(|m| (1..=12).contains(&m)));
    assert_eq!(parts[4], "%");
    assert_eq!(parts[5], "%Q");
    assert!(parts[1].starts_with(&parts[0][3..6]), "{s}");
}
