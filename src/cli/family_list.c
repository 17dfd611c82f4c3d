/* The model families of the registry (src/model/family.c) in words for --help and the command list,
 * so that a family added there is named everywhere without editing a hand-written string. */
#include <stdio.h>
#include <string.h>

#include "../model/family.h"
#include "commands.h"

const char *fsdp_cli_family_list(void) {
    static char text[512];
    if (text[0]) return text;
    const fsdp_family *const *fams = fsdp_families();
    int n = 0;
    while (fams[n]) n++;
    for (int i = 0; i < n; i++) {
        /* "LlamaForCausalLM" -> "Llama": the name transformers gives the family. */
        const char *arch = fams[i]->architecture ? fams[i]->architecture : fams[i]->model_type;
        const char *end = strstr(arch, "ForCausalLM");
        int len = end ? (int)(end - arch) : (int)strlen(arch);
        size_t used = strlen(text);
        const char *sep = i == 0 ? "" : i == n - 1 ? (n > 2 ? ", or " : " or ") : ", ";
        snprintf(text + used, sizeof text - used, "%s%.*s", sep, len, arch);
    }
    return text;
}
