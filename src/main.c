/* fsdp: the program's entry. Initialises MPI, dispatches to a subcommand, finalises MPI. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/fault.h"
#include "base/host_threads.h"
#include "base/watchdog.h"
#include "cli/commands.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command COMMANDS[] = {
    {"train", fsdp_cmd_train, "train or fine-tune a %s model with FSDP over MPI ranks"},
    {"report", fsdp_cmd_report, "tables and plots (report.md, PNG) of the course's experiments from run metrics"},
    {"tokenize", fsdp_cmd_tokenize, "encode text to token ids (or decode ids) with a Hugging Face tokenizer.json"},
    {"prepare", fsdp_cmd_prepare, "tokenize text, JSON Lines or Alpaca data into token files for training"},
    {"plan", fsdp_cmd_plan, "the memory a training configuration reserves per GPU, and the largest micro-batch that fits"},
    {"export", fsdp_cmd_export, "write a checkpoint as a Hugging Face model directory (safetensors) for transformers"},
    {"verify", fsdp_cmd_verify, "check checkpoints completely (checksums, attributes) and say what they hold"},
    {"generate", fsdp_cmd_generate, "continue a prompt with a model, streaming the text (KV cache, CPU or one GPU)"},
    {"eval", fsdp_cmd_eval, "validation loss and perplexity of a model or checkpoint over a token file"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: fsdp COMMAND [FLAGS]   (fsdp COMMAND --help for its flags)\n\n"
                 "fsdp.c %s: fully sharded data-parallel training of decoder-only LLMs, one native program\n"
                 "launched by mpirun or srun.\n\ncommands:\n",
            FSDP_VERSION);
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
    {
        /* A summary with %s names the model families (from their registry). */
        fprintf(out, "  %-10s ", COMMANDS[i].name);
        fprintf(out, COMMANDS[i].summary, fsdp_cli_family_list());
        fputc('\n', out);
    }
}

int main(int argc, char **argv) {
    /* Every rank waits inside MPI's start-up for the others to join, before any wait of fsdp.c is
     * bounded: a rank that never joins must not hold the job there until its time limit. */
    fsdp_startup_watchdog_arm("MPI start-up, which ends once every rank of the job has joined (MPI_Init_thread)");
    fsdp_fault_startup();
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "fsdp: error: MPI_Init_thread failed\n");
        return 1;
    }
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    fsdp_set_rank(rank, world);
    /* Errors in MPI calls come back as codes so that FSDP_CHECK_MPI can name the call and rank. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    fsdp_share_host_threads(MPI_COMM_WORLD); /* the first collective: still start-up */
    fsdp_startup_watchdog_disarm();

    int status;
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (rank == 0) usage(stdout);
        status = argc < 2 ? 2 : 0;
    } else if (!strcmp(argv[1], "--version")) {
#ifdef FSDP_HAVE_CUDA
        if (rank == 0) printf("fsdp.c %s (backends: cpu, cuda)\n", FSDP_VERSION);
#else
        if (rank == 0) printf("fsdp.c %s (backends: cpu)\n", FSDP_VERSION);
#endif
        status = 0;
    } else {
        const command *cmd = NULL;
        for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
            if (!strcmp(argv[1], COMMANDS[i].name)) cmd = &COMMANDS[i];
        if (!cmd) {
            fsdp_err err = {0};
            fsdp_usagef(&err, "unknown command '%s' (see fsdp --help)", argv[1]);
            fsdp_exit_error(&err, 0);
        }
        status = cmd->run(argc - 1, argv + 1);
    }
    MPI_Finalize();
    return status;
}
