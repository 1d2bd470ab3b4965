/* stories260K prompts and their ids with BOS, as Hugging Face tokenizers 0.23.2 (npm
 * `tokenizers`, run by tests/integration/tokenizer/hf_tokenize.js) encodes them with
 * models/stories260K-hf/tokenizer.json of the test data (TYCHO_TEST_DATA). The GGUF
 * vocabulary is the same tok512, so llama.cpp's SPM algorithm must give the same ids. Covers byte fallback (emoji, CJK, "ï"),
 * tabs and newlines, runs of spaces and digits. */
#ifndef TYCHO_TOK_SPM_CASES_H
#define TYCHO_TOK_SPM_CASES_H

#include <stdint.h>

struct spm_case {
    const char *text;
    uint32_t n;
    uint32_t ids[24];
};

static const struct spm_case spm_cases[] = {
    {"Once upon a time", 5, {1, 403, 407, 261, 378}},
    {"Lily and Ben went to the park.", 13, {1, 317, 269, 368, 302, 263, 377, 267, 265, 282, 295, 433, 426}},
    {"The cat sat on the mat. It was happy!", 16,
     {1, 291, 280, 294, 262, 294, 353, 265, 284, 294, 426, 359, 413, 286, 393, 443}},
    {"Tom said, \"I want a red ball.\"", 15,
     {1, 274, 287, 336, 432, 313, 442, 391, 261, 352, 266, 268, 388, 426, 436}},
    {"Hello \xf0\x9f\x9a\x80 world", 12, {1, 346, 306, 414, 410, 243, 162, 157, 131, 263, 304, 341}},
    {"na\xc3\xafve caf\xc3\xa9", 10, {1, 297, 412, 198, 178, 360, 280, 412, 431, 485}},
    {"\xe6\x97\xa5\xe6\x9c\xac", 8, {1, 410, 233, 154, 168, 233, 159, 175}},
    {"a\nb\tc", 6, {1, 261, 13, 430, 12, 429}},
    {"  two  spaces", 12, {1, 410, 410, 259, 424, 414, 410, 262, 427, 412, 331, 419}},
    {"x", 3, {1, 410, 444}},
    {"12345 + 678 = ?", 17, {1, 410, 475, 479, 472, 484, 480, 410, 496, 410, 490, 491, 487, 410, 64, 410, 450}},
    {"\xf0\x9f\x99\x82", 6, {1, 410, 243, 162, 156, 133}},
};

#endif
