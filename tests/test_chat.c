/*
 * test_chat.c — chat templates: each common format is recognised from the
 * markers in its Jinja source and rendered exactly as that template renders
 * a system + user + assistant + user conversation with the generation prompt.
 */
#include <stdlib.h>

#include "serve/chat.h"
#include "tb_test.h"

static const tb_chat_message conv[] = {
    {"system", "Be brief.", 0},
    {"user", "Hi", 0},
    {"assistant", "Hello.", 0},
    {"user", "Who are you?", 0},
};

static void expect(tb_chat_format f, const char *bos, const char *want) {
    char *got = tb_chat_render(f, conv, 4, bos, NULL);
    CHECK_MSG(got && strcmp(got, want) == 0, "%s:\n got [%s]\nwant [%s]", tb_chat_format_name(f), got ? got : "(null)",
              want);
    free(got);
}

int main(void) {
    /* detection from template sources (abridged from the models' tokenizer_config.json) */
    CHECK(tb_chat_detect("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                         "'<|im_end|>' + '\\n'}}{% endfor %}") == TB_CHAT_CHATML);
    CHECK(tb_chat_detect("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
                         "\\n\\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}") == TB_CHAT_LLAMA3);
    CHECK(tb_chat_detect("{% if messages[0]['role'] == 'system' %}<<SYS>>\\n{% endif %}{{ bos_token + '[INST] ' }}")
          == TB_CHAT_LLAMA2);
    CHECK(tb_chat_detect("{{ bos_token }}{% for message in messages %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
                         "{% endfor %}") == TB_CHAT_MISTRAL);
    CHECK(tb_chat_detect(NULL) == TB_CHAT_PLAIN);
    CHECK(tb_chat_detect("{{ messages | tojson }}") == TB_CHAT_PLAIN);

    expect(TB_CHAT_CHATML, "",
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello."
           "<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n");
    expect(TB_CHAT_LLAMA3, "<|begin_of_text|>",
           "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
           "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nWho are you?<|eot_id|><|start_header_id|>assistant"
           "<|end_header_id|>\n\n");
    expect(TB_CHAT_LLAMA2, "<s>",
           "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Who are you? [/INST]");
    expect(TB_CHAT_MISTRAL, "<s>", "<s>[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] Who are you? [/INST]");
    expect(TB_CHAT_PLAIN, "",
           "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello.\n\nUser: Who are you?\n\nAssistant:");
    /* message text may hold NUL characters (a JSON "\u0000"): rendered with its length, not cut there */
    {
        const tb_chat_message nul[] = {{"user", "a\0b", 3}};
        static const char want[] = "<|im_start|>user\na\0b<|im_end|>\n<|im_start|>assistant\n";
        size_t len = 0;
        char *got = tb_chat_render(TB_CHAT_CHATML, nul, 1, "", &len);
        CHECK_MSG(got && len == sizeof want - 1 && !memcmp(got, want, len), "a NUL in a message: %zu bytes, want %zu",
                  len, sizeof want - 1);
        free(got);
        got = tb_chat_render(TB_CHAT_PLAIN, nul, 1, "", &len);
        CHECK(got && len == strlen("User: a") + 1 + strlen("b\n\nAssistant:") && got[7] == 0 && got[8] == 'b');
        free(got);
    }
    return tb_test_finish("test_chat");
}
