/*
 * chat.h — chat templates: turning a list of messages into prompt text.
 *
 * Models ship a Jinja template in tokenizer_config.json. Rather than run
 * Jinja, the server recognises the common formats by their markers and
 * renders them natively: ChatML (<|im_start|>), Llama-3 (<|start_header_id|>),
 * Llama-2 ([INST] with <<SYS>>) and Mistral ([INST] without). A model with no
 * template or an unrecognised one uses the documented plain format:
 *   "System: ...\n\nUser: ...\n\nAssistant: ...\n\nUser: ...\n\nAssistant:"
 */
#ifndef TB_CHAT_H
#define TB_CHAT_H

#include <stddef.h>

typedef enum {
    TB_CHAT_PLAIN = 0,
    TB_CHAT_CHATML,
    TB_CHAT_LLAMA3,
    TB_CHAT_LLAMA2,
    TB_CHAT_MISTRAL,
} tb_chat_format;

typedef struct {
    const char *role;    /* system, user, assistant */
    const char *content;
    size_t content_len;  /* bytes of content (it may hold NULs); 0: strlen */
} tb_chat_message;

tb_chat_format tb_chat_detect(const char *jinja_template);
const char *tb_chat_format_name(tb_chat_format f);

/* Renders messages plus the assistant prompt. `bos` is the BOS token text
 * ("" when none) for formats that spell it. Returns a malloc'd string
 * (NUL-terminated; its length in *len when len is not NULL: the text holds
 * any NULs the messages did), NULL when out of memory. */
char *tb_chat_render(tb_chat_format f, const tb_chat_message *m, int n,
                     const char *bos, size_t *len);

#endif
