/*
 * test_chat.c — chat templates: each common format is recognised from the
 * markers in its Jinja source and rendered exactly as that template renders
 * a system + user + assistant + user conversation with the generation prompt.
 */
#include <stdlib.h>

#include "serve/chat.h"
#include "tb_test.h"

static const tb_chat_message conv[] = {
    {"system", "Be brief."},
    {"user", "Hi"},
    {"assistant", "Hello."},
    {"user", "Who are you?"},
};

static void expect(tb_chat_format f, const char *bos, const char *want) {
    char *got = tb_chat_render(f, conv, 4, bos);
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
    return tb_test_finish("test_chat");
}
