/* Tool calls and reasoning in model output (pure, no sockets, any thread): which output
 * family a chat template belongs to, the parse of a choice's output text into reasoning,
 * content and tool calls (OpenAI's message), the deltas a stream sends as that text grows, and
 * the JSON schemas that tool_choice "required" / a named function constrain the output to.
 *
 * One parse serves both paths: a stream re-parses the text it has so far (holding back what
 * might still become a marker) and sends what grew since the last step, and the last step is
 * the whole response's parse, so streamed deltas always assemble to the non-streamed message.
 * Tool calls are sent whole: one delta with index, id, type, name and arguments "", then one
 * with the arguments, once the call is closed (or the output ends). */
#ifndef TYCHO_API_TOOLS_H
#define TYCHO_API_TOOLS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

enum ty__api_fam {
    TY__API_FAM_NONE = 0, /* no tool-call syntax known: output is content */
    TY__API_FAM_HERMES,   /* Qwen / Hermes: <tool_call>\n{"name","arguments"}\n</tool_call> */
    TY__API_FAM_HARMONY,  /* gpt-oss: <|channel|>... to=functions.NAME ...<|message|>..<|call|> */
    TY__API_FAM_DEEPSEEK, /* DeepSeek-V3: <｜tool▁calls▁begin｜>... */
    TY__API_FAM_LLAMA3,   /* Llama 3.x JSON: {"name","parameters"} as the whole output */
};

/* The family of a chat template's source (NULL: NONE). */
enum ty__api_fam ty__api_fam_detect(const char *tpl_source);
const char *ty__api_fam_name(enum ty__api_fam f);
/* Whether `text` (a control token's text, which the detokenizer leaves out) is one of f's
 * markers, to be fed to the parser although the event text lacks it. */
bool ty__api_fam_marker(enum ty__api_fam f, const char *text, size_t len);

enum ty__api_out_mode {
    TY__API_OUT_TEXT = 0, /* content (and reasoning) only: tool_choice none, no tools */
    TY__API_OUT_AUTO,     /* tool calls in the family's syntax */
    TY__API_OUT_REQUIRED, /* the whole output is [{"name","parameters"}, ...] (constrained) */
    TY__API_OUT_NAMED,    /* the whole output is the named function's arguments (constrained) */
};

struct ty__api_outcfg {
    enum ty__api_fam fam;
    enum ty__api_out_mode mode;
    bool think;      /* <think>...</think> at the start is reasoning (Qwen3, DeepSeek-R1) */
    bool think_open; /* the prompt ended inside <think>: the output starts as reasoning */
    const char *named; /* NAMED: the function's name (borrowed) */
};

struct ty__api_call {
    char *name, *args; /* malloc'd; args: the arguments' JSON text */
};

/* A parse: reasoning (has_reasoning: any was found), content and complete tool calls. */
struct ty__api_snap {
    char *reasoning, *content; /* malloc'd, NUL-terminated */
    size_t n_reasoning, n_content;
    bool has_reasoning;
    struct ty__api_call *calls;
    size_t n_calls;
};

/* Parse `text`. Not final: what might still become a marker, and calls not yet closed, are
 * left out (they come in a later, longer parse). Returns 0 or TY_ENOMEM. */
int ty__api_out_parse(const struct ty__api_outcfg *c, const char *text, size_t len, bool final,
                      struct ty__api_snap *out);
void ty__api_snap_clear(struct ty__api_snap *s);
/* The message's content as OpenAI has it: NULL (JSON null) when there are tool calls and
 * the content is only whitespace, else s->content. */
const char *ty__api_snap_content(const struct ty__api_snap *s);

/* A stream's parser: its text so far and what has been sent of it. */
struct ty__api_out {
    struct ty__api_outcfg cfg;
    char *buf; /* malloc'd */
    size_t n, cap;
    size_t sent_reasoning, sent_content, sent_calls;
};

enum ty__api_delta_kind { TY__API_DELTA_REASONING, TY__API_DELTA_CONTENT, TY__API_DELTA_CALL };

struct ty__api_delta {
    enum ty__api_delta_kind kind;
    const char *text; /* REASONING / CONTENT */
    size_t len;
    size_t index;                  /* CALL: its index among the choice's calls */
    const struct ty__api_call *call; /* CALL */
};

typedef void (*ty__api_delta_cb)(void *arg, const struct ty__api_delta *d);

void ty__api_out_init(struct ty__api_out *o, const struct ty__api_outcfg *c);
void ty__api_out_free(struct ty__api_out *o);
/* Append output text. Returns 0 or TY_ENOMEM. */
int ty__api_out_feed(struct ty__api_out *o, const char *text, size_t len);
/* Parse what was fed and call cb for each delta since the last step, in order: reasoning,
 * content, then each new call. `final`: the output ended. When `snap` is given it receives
 * the parse (the caller clears it), else it is freed. Returns 0 or TY_ENOMEM. */
int ty__api_out_step(struct ty__api_out *o, bool final, ty__api_delta_cb cb, void *arg,
                     struct ty__api_snap *snap);

/* The schema a constrained tool choice generates with (malloc'd compact JSON, NULL when out
 * of memory): named == NULL: vLLM's "required" array, [{"name": enum, "parameters": schema}]
 * with one anyOf branch per tool and at least one item; else that tool's parameters (an
 * empty object schema when it has none). `tools` is a validated tools array. */
char *ty__api_tools_schema(json_t *tools, const char *named);

/* A tool-call id: "call_" and 24 random letters and digits (buf of at least 30 bytes). */
void ty__api_call_id(char *buf, size_t cap, unsigned long long seed);

#endif
