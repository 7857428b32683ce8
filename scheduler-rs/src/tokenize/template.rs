//! HF chat templates rendered with minijinja (Jinja2 semantics as `transformers` sets them
//! up: `trim_blocks`, `lstrip_blocks`, Python string methods via `pycompat`, and the
//! `raise_exception` helper).

use minijinja::{Environment, Error, ErrorKind};
use serde_json::{json, Map, Value};

/// Name of the only template in the environment.
const NAME: &str = "chat";

/// Template variables a caller's kwargs may not set: the renderer owns them.
pub const RESERVED_KWARGS: [&str; 2] = ["messages", "tools"];

/// Most instructions one render may run (minijinja's fuel): a template sent with a request
/// (`chat_template`) cannot hold the router's executor with a huge nested loop.
const RENDER_FUEL: u64 = 5_000_000;

/// A compiled chat template with its special tokens.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The variables the template reads from its context (`tools`, `reasoning_effort`, ...).
    reads: std::collections::BTreeSet<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compile `source`. Fails on a syntax error.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.set_fuel(Some(RENDER_FUEL));
        env.add_template_owned(NAME, source.to_string())?;
        let reads = env
            .get_template(NAME)?
            .undeclared_variables(false)
            .into_iter()
            .collect();
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            reads,
        })
    }

    /// Another template source with this one's special tokens (a request's `chat_template`,
    /// or a router-wide `--chat-template`). Fails on a syntax error.
    pub fn with_source(&self, source: &str) -> Result<Self, Error> {
        ChatTemplate::new(source, &self.bos_token, &self.eos_token)
    }

    /// Whether the template renders `tools` (HF templates that support tool calling read it).
    pub fn supports_tools(&self) -> bool {
        self.reads("tools")
    }

    /// Whether the template reads the context variable `name` (e.g. `reasoning_effort`).
    pub fn reads(&self, name: &str) -> bool {
        self.reads.contains(name)
    }

    /// Render a conversation. `messages` are JSON objects with at least `role` and `content`.
    pub fn render(&self, messages: &[Value], add_generation_prompt: bool) -> Result<String, Error> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// `render`, showing the model `tools` (an OpenAI `tools` array) when given.
    pub fn render_with_tools(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
        tools: Option<&[Value]>,
    ) -> Result<String, Error> {
        let kwargs = Map::from_iter([(
            "add_generation_prompt".to_string(),
            Value::Bool(add_generation_prompt),
        )]);
        self.render_with_kwargs(messages, tools, &kwargs)
    }

    /// Render with extra template variables (vLLM's `chat_template_kwargs`: e.g.
    /// `add_generation_prompt`, `enable_thinking`, a template's own variables). They override
    /// the defaults (`add_generation_prompt: true`, `bos_token`, `eos_token`).
    /// NOTE: `RESERVED_KWARGS` in `kwargs` are ignored here; callers refuse them first.
    pub fn render_with_kwargs(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        kwargs: &Map<String, Value>,
    ) -> Result<String, Error> {
        let tmpl = self.env.get_template(NAME)?;
        let mut ctx = json!({
            "add_generation_prompt": true,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        });
        for (k, v) in kwargs {
            if !RESERVED_KWARGS.contains(&k.as_str()) {
                ctx[k] = v.clone();
            }
        }
        ctx["messages"] = Value::from(messages.to_vec());
        if let Some(tools) = tools {
            ctx["tools"] = Value::from(tools.to_vec());
        }
        tmpl.render(minijinja::Value::from(minijinja::value::Serde(&ctx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ChatML template used by SmolLM2 / Qwen-style models.
    pub(crate) const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_renders_with_generation_prompt() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let msgs = [json!({"role": "user", "content": "Hi"})];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(!t.render(&msgs, false).unwrap().ends_with("assistant\n"));
    }

    #[test]
    fn llama_style_template_with_strip_bos_and_raise_exception() {
        let src = "{{ bos_token }}{% for m in messages %}\
            {% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}\
            {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
            {% endif %}\
            {% if m['role'] == 'user' %}{{ '[INST] ' + m['content'].strip() + ' [/INST]' }}\
            {% else %}{{ ' ' + m['content'].strip() + eos_token }}{% endif %}{% endfor %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let ok = [
            json!({"role": "user", "content": "  a "}),
            json!({"role": "assistant", "content": "b"}),
        ];
        assert_eq!(t.render(&ok, false).unwrap(), "<s>[INST] a [/INST] b</s>");
        let bad = [json!({"role": "assistant", "content": "b"})];
        let err = t.render(&bad, false).unwrap_err();
        assert!(err.to_string().contains("must alternate"), "{err}");
        assert!(ChatTemplate::new("{% if %}", "", "").is_err());
    }

    #[test]
    fn templates_that_read_tools_render_them() {
        assert!(!ChatTemplate::new(CHATML, "", "").unwrap().supports_tools());
        let src =
            "{% if tools %}{% for t in tools %}<tool>{{ t.function.name }}</tool>{% endfor %}\
            {% endif %}{% for m in messages %}{{ m.content }}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert!(t.supports_tools());
        let msgs = [json!({"role": "user", "content": "x"})];
        let tools = [json!({"type": "function", "function": {"name": "now"}})];
        assert_eq!(
            t.render_with_tools(&msgs, true, Some(&tools)).unwrap(),
            "<tool>now</tool>x"
        );
        assert_eq!(t.render(&msgs, true).unwrap(), "x");
    }

    #[test]
    fn kwargs_reach_the_template_and_another_source_keeps_the_special_tokens() {
        let t = ChatTemplate::new(CHATML, "<s>", "<|im_end|>").unwrap();
        let src = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}\
            {% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}\
            {% if add_generation_prompt %}>{% endif %}";
        let other = t.with_source(src).unwrap();
        let msgs = [json!({"role": "user", "content": "x"})];
        let kw = |v: Value| v.as_object().unwrap().clone();
        assert_eq!(
            other.render_with_kwargs(&msgs, None, &Map::new()).unwrap(),
            "<s>x>"
        );
        let off = kw(json!({"enable_thinking": false, "add_generation_prompt": false}));
        assert_eq!(
            other.render_with_kwargs(&msgs, None, &off).unwrap(),
            "<s>x/no_think"
        );
        // The renderer's own variables cannot be replaced through kwargs.
        let reserved = kw(json!({"messages": [{"role": "user", "content": "y"}]}));
        assert_eq!(
            other.render_with_kwargs(&msgs, None, &reserved).unwrap(),
            "<s>x>"
        );
        assert!(t.with_source("{% for %}").is_err());
    }

    #[test]
    fn a_runaway_template_runs_out_of_fuel() {
        let src = "{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let err = t.render(&[], true).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::OutOfFuel, "{err}");
    }

    #[test]
    fn trim_and_lstrip_blocks_like_transformers() {
        let src = "{% for m in messages %}\n    {{ m.content }}\n{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let msgs = [
            json!({"role": "user", "content": "x"}),
            json!({"role": "user", "content": "y"}),
        ];
        assert_eq!(t.render(&msgs, false).unwrap(), "    x\n    y\n");
    }
}
