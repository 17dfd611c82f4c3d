/* fsdp: the program's entry. Initialises MPI, dispatches to a subcommand, finalises MPI.
 * The commands that run as one process (tokenize, prepare, report, --help, --version) leave MPI down
 * when nothing launched several ranks: they work on a login node whose MPI cannot start a singleton
 * (Slurm's PMI outside an allocation) and start in a fraction of the time. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
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
    int one_process; /* never talks to other ranks: runs without MPI when launched alone */
} command;

static const command COMMANDS[] = {
    {"train", fsdp_cmd_train, "train or fine-tune a %s model with FSDP over MPI ranks", 0},
    {"report", fsdp_cmd_report, "tables and plots (report.md, PNG) of the course's experiments from run metrics", 1},
    {"tokenize", fsdp_cmd_tokenize, "encode text to token ids (or decode ids) with a Hugging Face tokenizer.json", 1},
    {"prepare", fsdp_cmd_prepare, "tokenize text, JSON Lines or Alpaca data into token files for training", 1},
    {"plan", fsdp_cmd_plan, "the memory a training configuration reserves per GPU, and the largest micro-batch that fits", 0},
    {"export", fsdp_cmd_export, "write a checkpoint as a Hugging Face model directory (safetensors) for transformers", 0},
    {"verify", fsdp_cmd_verify, "check checkpoints completely (checksums, attributes) and say what they hold", 0},
    {"generate", fsdp_cmd_generate, "continue a prompt with a model, streaming the text (KV cache, CPU or one GPU)", 0},
    {"eval", fsdp_cmd_eval, "validation loss and perplexity of a model or checkpoint over a token file", 0},
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

static const command *find_command(const char *name) {
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(name, COMMANDS[i].name)) return &COMMANDS[i];
    return NULL;
}

static int runs_without_mpi(int argc, char **argv) {
    if (fsdp_startup_world() > 1) return 0;
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help") ||
        !strcmp(argv[1], "--version"))
        return 1;
    const command *cmd = find_command(argv[1]);
    return cmd && cmd->one_process;
}

/* Every rank waits inside MPI's start-up for the others to join, before any wait of fsdp.c is
 * bounded: a rank that never joins must not hold the job there until its time limit. */
static int start_mpi(int *argc, char ***argv) {
    fsdp_startup_watchdog_arm("MPI start-up, which ends once every rank of the job has joined (MPI_Init_thread)");
    fsdp_fault_startup();
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "fsdp: error: MPI_Init_thread failed\n");
        return 1;
    }
    int rank = 0, world = 1;
    FSDP_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    FSDP_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
    fsdp_set_rank(rank, world);
    /* Errors in MPI calls come back as codes so that FSDP_CHECK_MPI can name the call and rank. */
    FSDP_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    fsdp_share_host_threads(MPI_COMM_WORLD); /* the first collective: still start-up */
    fsdp_startup_watchdog_disarm();
    return 0;
}

int main(int argc, char **argv) {
    const int with_mpi = !runs_without_mpi(argc, argv);
    if (with_mpi) {
        int status = start_mpi(&argc, &argv);
        if (status) return status;
    } else {
        fsdp_fault_startup();
        fsdp_set_rank(0, 1);
        fsdp_share_host_threads(MPI_COMM_NULL);
    }
    const int rank = fsdp_rank();

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
        const command *cmd = find_command(argv[1]);
        if (!cmd) {
            fsdp_err err = {0};
            fsdp_usagef(&err, "unknown command '%s' (see fsdp --help)", argv[1]);
            fsdp_exit_error(&err, 0);
        }
        status = cmd->run(argc - 1, argv + 1);
    }
    if (with_mpi) MPI_Finalize();
    return status;
}
