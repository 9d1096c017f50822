/* chat.c — native renderings of the common chat templates. */
#include "serve/chat.h"

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

/* Bytes appended with their lengths: message text may hold NUL characters
 * (a JSON string may spell U+0000), which printf-style formatting would cut. */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} buf;

static void add_n(buf *b, const char *s, size_t len) {
    if (b->oom) return;
    if (b->n + len + 1 > b->cap) {
        size_t cap = (b->cap + len + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) { b->oom = 1; return; }
        b->p = q;
        b->cap = cap;
    }
    if (len) memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = 0;
}

static void add(buf *b, const char *s) { add_n(b, s, strlen(s)); }

static void add_content(buf *b, const tb_chat_message *m) {
    add_n(b, m->content, m->content_len ? m->content_len : strlen(m->content));
}

char *tb_chat_render(tb_chat_format f, const tb_chat_message *m, int n, const char *bos, size_t *len) {
    buf b = {0};
    add(&b, "");
    if (!bos) bos = "";
    const tb_chat_message *sys = NULL;
    int first = 0;
    if (n > 0 && !strcmp(m[0].role, "system")) { sys = &m[0]; first = 1; }
    switch (f) {
    case TB_CHAT_CHATML:
        for (int i = 0; i < n; i++) {
            add(&b, "<|im_start|>");
            add(&b, m[i].role);
            add(&b, "\n");
            add_content(&b, &m[i]);
            add(&b, "<|im_end|>\n");
        }
        add(&b, "<|im_start|>assistant\n");
        break;
    case TB_CHAT_LLAMA3:
        add(&b, bos);
        for (int i = 0; i < n; i++) {
            add(&b, "<|start_header_id|>");
            add(&b, m[i].role);
            add(&b, "<|end_header_id|>\n\n");
            add_content(&b, &m[i]);
            add(&b, "<|eot_id|>");
        }
        add(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case TB_CHAT_LLAMA2:
    case TB_CHAT_MISTRAL: {
        /* Llama-2: every turn is "<s>[INST] user [/INST] assistant </s>", the
         * system prompt inside the first turn's <<SYS>> block. Mistral: one
         * BOS, "[INST] user [/INST]assistant</s>", the system prompt
         * prepended to the first user message. */
        int llama2 = f == TB_CHAT_LLAMA2, pending_sys = sys != NULL;
        if (!llama2) add(&b, bos);
        for (int i = first; i < n; i++) {
            if (!strcmp(m[i].role, "user")) {
                add(&b, llama2 ? bos : "");
                add(&b, "[INST] ");
                if (pending_sys) {
                    add(&b, llama2 ? "<<SYS>>\n" : "");
                    add_content(&b, sys);
                    add(&b, llama2 ? "\n<</SYS>>\n\n" : "\n\n");
                    pending_sys = 0;
                }
                add_content(&b, &m[i]);
                add(&b, " [/INST]");
            } else if (!strcmp(m[i].role, "assistant")) {
                add(&b, llama2 ? " " : "");
                add_content(&b, &m[i]);
                add(&b, llama2 ? " </s>" : "</s>");
            }
        }
        break;
    }
    default:
        for (int i = 0; i < n; i++) {
            const char *r = m[i].role;
            add(&b, !strcmp(r, "system") ? "System: " : !strcmp(r, "assistant") ? "Assistant: " : "User: ");
            add_content(&b, &m[i]);
            add(&b, "\n\n");
        }
        add(&b, "Assistant:");
        break;
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (len) *len = b.n;
    return b.p;
}
