/* The run's data sources, checked against the model (trainer.h: fsdp_trainer_open_data). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/agree.h"
#include "trainer.h"

static int open_one(fsdp_trainer *t, fsdp_data *d, const char *path, const char *flag, int eval, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    fsdp_data_spec spec = {path, flag, o->synthetic_vocab, o->packing, o->seq, o->seed, eval,
                           t->cfg.vocab_size, t->cfg.eos_token_id, t->cfg.pad_token_id};
    if (fsdp_data_open(d, &spec, err)) return -1;
    /* A model directory names its tokenizer: a token file made with another one is refused now,
     * not after hours of training on ids that mean other words. */
    struct stat st;
    if (o->init_from && stat(o->init_from, &st) == 0 && S_ISDIR(st.st_mode)) {
        char tokenizer[4200];
        snprintf(tokenizer, sizeof tokenizer, "%s/tokenizer.json", o->init_from);
        if (fsdp_data_check_tokenizer(d, tokenizer, err)) return -1;
    }
    return 0;
}

/* --data and --eval-data must be ids of one tokenizer: with the same vocabulary size nothing else
 * notices, and the validation loss would score the model on other words. Files without a recorded
 * tokenizer (hash 0) are compared by vocabulary only (fsdp_data_identity_differs). */
static int same_tokenizer(const fsdp_data *train, const fsdp_data *eval, fsdp_err *err) {
    if (train->synthetic) return 0;
    fsdp_data_identity a = fsdp_data_identity_of(train), b = fsdp_data_identity_of(eval);
    if (!fsdp_data_identity_differs(&a, &b)) return 0;
    return fsdp_usagef(err,
                       "--eval-data %s was made with another tokenizer (%016" PRIx64 ", %" PRIu64 " ids) than --data %s "
                       "(%016" PRIx64 ", %" PRIu64 " ids): its loss would score other words; prepare both with the "
                       "same tokenizer.json",
                       eval->file.path, b.tokenizer_hash, b.vocab_size, train->file.path, a.tokenizer_hash,
                       a.vocab_size);
}

int fsdp_trainer_open_data(fsdp_trainer *t, fsdp_err *err) {
    const fsdp_train_options *o = &t->opt;
    if (o->forward_only && (!o->data || !strcmp(o->data, "synthetic")))
        fsdp_usagef(err, "evaluation needs a token file (--data FILE)");
    else if (o->eval_data && !strcmp(o->eval_data, "synthetic"))
        fsdp_usagef(err, "--eval-data needs a token file (the validation split of fsdp prepare), not synthetic data");
    else if (open_one(t, &t->data, o->data, "--data", o->forward_only, err) == 0 && o->eval_data &&
             open_one(t, &t->eval_data, o->eval_data, "--eval-data", 1, err) == 0)
        same_tokenizer(&t->data, &t->eval_data, err);
    if (fsdp_agree(t->world, err)) return -1;
    if (o->epochs > 0) {
        uint64_t global = (uint64_t)o->mbs * (uint64_t)o->grad_accum * (uint64_t)t->topo.world;
        fsdp_data_epoch_steps(&t->data, o->epochs, global, &t->opt.steps, err);
        if (fsdp_agree(t->world, err)) return -1;
    }
    return 0;
}
