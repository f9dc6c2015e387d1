//! `tiktoken:<name>` tokenizers: known ids, the cookbook's chat count, the frame ids, names.

use tiktoken_rs::{num_tokens_from_messages, ChatCompletionRequestMessage, FunctionCall};

use super::*;
use pronto_core::tokens::{block_hashes, BLOCK_TOKENS};

fn tiktoken(name: &str) -> ModelTokenizer {
    ModelTokenizer::from_spec(&format!("tiktoken:{name}"), None).unwrap()
}

fn ids(t: &ModelTokenizer, endpoint: Endpoint, body: serde_json::Value) -> Option<Vec<u32>> {
    t.prompt_ids(endpoint, body.to_string().as_bytes()).unwrap()
}

fn bpe(name: &str) -> &'static tiktoken_rs::CoreBPE {
    match name {
        "o200k_base" => tiktoken_rs::o200k_base_singleton(),
        "o200k_harmony" => tiktoken_rs::o200k_harmony_singleton(),
        "cl100k_base" => tiktoken_rs::cl100k_base_singleton(),
        "p50k_base" => tiktoken_rs::p50k_base_singleton(),
        "p50k_edit" => tiktoken_rs::p50k_edit_singleton(),
        "r50k_base" => tiktoken_rs::r50k_base_singleton(),
        other => panic!("{other}"),
    }
}

#[test]
fn completions_are_ordinary_text_without_bos() {
    let t = tiktoken("cl100k_base");
    let one = |body| ids(&t, Endpoint::Completions, body).unwrap();
    assert_eq!(
        one(serde_json::json!({"prompt": "hello world"})),
        [15339, 1917]
    );
    // Several prompts are concatenated; embeddings read `input`.
    assert_eq!(
        ids(
            &t,
            Endpoint::Embeddings,
            serde_json::json!({"input": ["hello world", "hello world"]})
        )
        .unwrap(),
        [15339, 1917, 15339, 1917]
    );
    // Special-token text in a prompt is plain text, not `<|endoftext|>` (100257).
    let eot = one(serde_json::json!({"prompt": "<|endoftext|>"}));
    assert!(eot.len() > 1 && !eot.contains(&100257), "{eot:?}");
    // Token ids need no tokenizer.
    assert_eq!(
        ids(
            &t,
            Endpoint::Completions,
            serde_json::json!({"prompt": [1, 2, 3]})
        ),
        None
    );
    // o200k_base differs from cl100k_base on the same text.
    let o = ids(
        &tiktoken("o200k_base"),
        Endpoint::Completions,
        serde_json::json!({"prompt": "hello world"}),
    )
    .unwrap();
    assert_eq!(o, bpe("o200k_base").encode_ordinary("hello world"));
    assert_ne!(o, [15339, 1917]);
}

/// A conversation with every counted field, as a request body and as `tiktoken-rs` messages.
fn conversation() -> (serde_json::Value, Vec<ChatCompletionRequestMessage>) {
    let msg = |role: &str, content: Option<&str>| ChatCompletionRequestMessage {
        role: role.into(),
        content: content.map(str::to_string),
        ..Default::default()
    };
    let body = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": "You are a terse assistant. Answer in French."},
        {"role": "user", "name": "alice_42", "content": [
            {"type": "text", "text": "What is the weather"},
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
            {"type": "text", "text": "in Paris, today?"}]},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp_c\": 21}"},
        {"role": "assistant", "content": "", "refusal": "I cannot do that."},
        {"role": "user", "content": "Merci !"}]});
    let messages = vec![
        msg(
            "system",
            Some("You are a terse assistant. Answer in French."),
        ),
        ChatCompletionRequestMessage {
            name: Some("alice_42".into()),
            ..msg("user", Some("What is the weather\nin Paris, today?"))
        },
        ChatCompletionRequestMessage {
            tool_calls: vec![FunctionCall {
                name: "get_weather".into(),
                arguments: "{\"city\": \"Paris\"}".into(),
            }],
            ..msg("assistant", None)
        },
        msg("tool", Some("{\"temp_c\": 21}")),
        ChatCompletionRequestMessage {
            refusal: Some("I cannot do that.".into()),
            ..msg("assistant", Some(""))
        },
        msg("user", Some("Merci !")),
    ];
    (body, messages)
}

#[test]
fn chat_without_a_template_counts_as_the_openai_cookbook() {
    let (body, messages) = conversation();
    for (model, encoding) in [("gpt-4o", "o200k_base"), ("gpt-4", "cl100k_base")] {
        let t = tiktoken(model);
        assert_eq!(t.tiktoken_encoding(), Some(encoding));
        let ours = ids(&t, Endpoint::ChatCompletions, body.clone()).unwrap();
        let cookbook = num_tokens_from_messages(model, &messages).unwrap();
        assert_eq!(ours.len(), cookbook, "{model}");
    }
    // The legacy `function_call` counts as a tool call does.
    let body = serde_json::json!({"messages": [{"role": "assistant", "content": null,
        "function_call": {"name": "f", "arguments": "{\"a\": 1}"}}]});
    let messages = [ChatCompletionRequestMessage {
        role: "assistant".into(),
        function_call: Some(FunctionCall {
            name: "f".into(),
            arguments: "{\"a\": 1}".into(),
        }),
        ..Default::default()
    }];
    let t = tiktoken("gpt-4o");
    assert_eq!(
        ids(&t, Endpoint::ChatCompletions, body).unwrap().len(),
        num_tokens_from_messages("gpt-4o", &messages).unwrap()
    );
}

#[test]
fn chat_frame_ids_never_collide_with_text() {
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hello world"}]});
    for (name, frame) in [
        ("o200k_base", [200006, 200008, 200007]),
        ("o200k_harmony", [200006, 200008, 200007]),
        ("cl100k_base", [100264, 100266, 100265]),
        ("p50k_base", [50281, 50282, 50283]),
        ("p50k_edit", [50284, 50285, 50286]),
        ("r50k_base", [50257, 50258, 50259]),
    ] {
        let b = bpe(name);
        let [start, sep, end] = frame;
        let mut want = vec![start];
        want.extend(b.encode_ordinary("user"));
        want.push(sep);
        want.extend(b.encode_ordinary("hello world"));
        want.extend([end, start]);
        want.extend(b.encode_ordinary("assistant"));
        want.push(sep);
        assert_eq!(
            ids(&tiktoken(name), Endpoint::ChatCompletions, body.clone()).unwrap(),
            want,
            "{name}"
        );
        for id in frame {
            let decoded = b.decode_bytes(&[id]);
            if name == "o200k_harmony" {
                // Harmony's own chat tokens.
                let text = String::from_utf8(decoded.unwrap()).unwrap();
                assert!(["<|start|>", "<|message|>", "<|end|>"].contains(&text.as_str()));
            } else {
                assert!(decoded.is_err(), "{name}: {id} is a text token");
            }
        }
    }
    // A client cannot forge the frame: its text is ordinary.
    let forged = serde_json::json!({"messages": [{"role": "user", "content": "<|end|><|start|>"}]});
    let got = ids(
        &tiktoken("o200k_harmony"),
        Endpoint::ChatCompletions,
        forged,
    )
    .unwrap();
    assert_eq!(got.iter().filter(|&&id| id == 200006).count(), 2, "{got:?}");
}

#[test]
fn a_shared_system_prompt_gives_shared_leading_blocks() {
    let t = tiktoken("o200k_base");
    let system =
        "You are Pronto's support assistant. Answer briefly and cite the docs. ".repeat(20);
    let chat = |user: &str| {
        let body = serde_json::json!({"messages": [
            {"role": "system", "content": system}, {"role": "user", "content": user}]});
        ids(&t, Endpoint::ChatCompletions, body).unwrap()
    };
    let (a, b) = (chat("How do I reload?"), chat("Which metrics exist?"));
    // START system SEP, the system prompt, END, START user SEP: then they differ ("system"
    // and "user" are one token each).
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let system_turn = 4 + bpe("o200k_base").encode_ordinary(&system).len();
    assert_eq!(common, system_turn + 3);
    let (ha, hb) = (
        block_hashes(&a, BLOCK_TOKENS),
        block_hashes(&b, BLOCK_TOKENS),
    );
    let shared = ha.iter().zip(&hb).take_while(|(x, y)| x == y).count();
    assert_eq!(shared, common / BLOCK_TOKENS);
    assert!(shared >= 10, "{shared} blocks in common");
}

#[test]
fn a_chat_template_renders_then_special_tokens_are_recognised() {
    let dir = std::env::temp_dir().join(format!("pronto-tiktoken-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("harmony.jinja");
    std::fs::write(
        &file,
        "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>\
         {% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}{{ eos_token }}",
    )
    .unwrap();
    let t = ModelTokenizer::from_spec("tiktoken:gpt-oss-20b", Some(&file)).unwrap();
    let again = ModelTokenizer::from_spec("tiktoken:o200k_harmony", Some(&file)).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(t.tiktoken_encoding(), Some("o200k_harmony"));
    assert_eq!(
        t.chat_template_source(),
        Some(file.display().to_string().as_str())
    );
    assert_eq!(t, again);
    assert_ne!(t, tiktoken("o200k_harmony"), "a template changes the ids");

    let body = serde_json::json!({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}]});
    let b = bpe("o200k_harmony");
    let mut want = vec![200006];
    want.extend(b.encode_ordinary("user"));
    want.push(200008);
    want.extend(b.encode_ordinary("hi\nthere"));
    want.extend([200007, 200006]);
    want.extend(b.encode_ordinary("assistant"));
    want.push(199999);
    assert_eq!(ids(&t, Endpoint::ChatCompletions, body).unwrap(), want);
}

#[test]
fn names_resolve_and_unknown_names_list_the_encodings() {
    for (name, encoding) in [
        ("o200k_base", "o200k_base"),
        ("o200k_harmony", "o200k_harmony"),
        ("cl100k_base", "cl100k_base"),
        ("p50k_base", "p50k_base"),
        ("p50k_edit", "p50k_edit"),
        ("r50k_base", "r50k_base"),
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-2024-05-13", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
        ("gpt-oss-120b", "o200k_harmony"),
        ("text-davinci-003", "p50k_base"),
        ("gpt2", "r50k_base"),
    ] {
        let t = tiktoken(name);
        assert_eq!(t.tiktoken_encoding(), Some(encoding), "{name}");
        assert_eq!(t.path(), Path::new(&format!("tiktoken:{name}")));
        assert!(t.has_chat_template(), "{name}: chat is counted");
        assert_eq!(t.chat_template_source(), None);
    }
    for bad in ["nope", "", "O200K_BASE", "cl100k_base "] {
        let e = ModelTokenizer::from_spec(&format!("tiktoken:{bad}"), None).unwrap_err();
        assert_eq!(
            e,
            format!(
                "unknown tiktoken encoding \"{bad}\" (one of: o200k_base, o200k_harmony, \
                 cl100k_base, p50k_base, p50k_edit, r50k_base; or an OpenAI model name such as \
                 gpt-4o)"
            )
        );
    }
    // A template that does not exist is named.
    let e = ModelTokenizer::from_spec("tiktoken:gpt-4o", Some(Path::new("/nonexistent.jinja")))
        .unwrap_err();
    assert!(e.contains("cannot read /nonexistent.jinja"), "{e}");
}

#[test]
fn equal_when_the_encoding_is() {
    assert_eq!(tiktoken("gpt-4o"), tiktoken("o200k_base"));
    assert_eq!(tiktoken("cl100k_base"), tiktoken("cl100k_base"));
    assert_ne!(tiktoken("o200k_base"), tiktoken("o200k_harmony"));
    assert_ne!(tiktoken("gpt-4"), tiktoken("gpt-4o"));
}
