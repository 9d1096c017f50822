/* chat.c — native renderings of the common chat templates. */
#include "serve/chat.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tb_chat_format tb_chat_detect(const char *t) {
    if (!t || !*t) return TB_CHAT_PLAIN;
    if (strstr(t, "<|im_start|>")) return TB_CHAT_CHATML;
    if (strstr(t, "<|start_header_id|>")) return TB_CHAT_LLAMA3;
    if (strstr(t, "[INST]") && strstr(t, "<<SYS>>")) return TB_CHAT_LLAMA2;
    if (strstr(t, "[INST]")) return TB_CHAT_MISTRAL;
    return TB_CHAT_PLAIN;
}

const char *tb_chat_format_name(tb_chat_format f) {
    static const char *n[] = {"plain", "chatml", "llama3", "llama2", "mistral"};
    return (unsigned)f < 5 ? n[f] : "?";
}

typedef struct {
    char *p;
    size_t n, cap;
} buf;

static void add(buf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->p && (size_t)k < b->cap - b->n) { b->n += (size_t)k; return; }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) return;
        b->p = q;
        b->cap = cap;
    }
}

char *tb_chat_render(tb_chat_format f, const tb_chat_message *m, int n, const char *bos) {
    buf b = {0};
    add(&b, "%s", "");
    if (!bos) bos = "";
    const char *sys = NULL;
    int first = 0;
    if (n > 0 && !strcmp(m[0].role, "system")) { sys = m[0].content; first = 1; }
    switch (f) {
    case TB_CHAT_CHATML:
        for (int i = 0; i < n; i++) add(&b, "<|im_start|>%s\n%s<|im_end|>\n", m[i].role, m[i].content);
        add(&b, "<|im_start|>assistant\n");
        break;
    case TB_CHAT_LLAMA3:
        add(&b, "%s", bos);
        for (int i = 0; i < n; i++)
            add(&b, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", m[i].role, m[i].content);
        add(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case TB_CHAT_LLAMA2:
    case TB_CHAT_MISTRAL: {
        /* Llama-2: every turn is "<s>[INST] user [/INST] assistant </s>", the
         * system prompt inside the first turn's <<SYS>> block. Mistral: one
         * BOS, "[INST] user [/INST]assistant</s>", the system prompt
         * prepended to the first user message. */
        int llama2 = f == TB_CHAT_LLAMA2, pending_sys = sys != NULL;
        if (!llama2) add(&b, "%s", bos);
        for (int i = first; i < n; i++) {
            if (!strcmp(m[i].role, "user")) {
                add(&b, "%s[INST] ", llama2 ? bos : "");
                if (pending_sys) {
                    if (llama2) add(&b, "<<SYS>>\n%s\n<</SYS>>\n\n", sys);
                    else add(&b, "%s\n\n", sys);
                    pending_sys = 0;
                }
                add(&b, "%s [/INST]", m[i].content);
            } else if (!strcmp(m[i].role, "assistant")) {
                add(&b, llama2 ? " %s </s>" : "%s</s>", m[i].content);
            }
        }
        break;
    }
    default:
        for (int i = 0; i < n; i++) {
            const char *r = m[i].role;
            const char *name = !strcmp(r, "system") ? "System" : !strcmp(r, "assistant") ? "Assistant" : "User";
            add(&b, "%s: %s\n\n", name, m[i].content);
        }
        add(&b, "Assistant:");
        break;
    }
    return b.p;
}
