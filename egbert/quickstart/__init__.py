"""`egbert quickstart`: the main job end to end on local data, in a wall-clock budget, planned
for the machine it runs on; a rerun reuses every finished step.

    egbert quickstart [--data PATH] [--output-dir runs/quickstart] [--budget-minutes 30]

1. trains the shared WordPiece tokenizer on WikiText-2 train;
2. plans: times a few training steps of each family at its presets and batches on this device
   (`throughput`), and from those rates, the budget and the corpus size picks each family's
   size, batch, sequence length and passes over the corpus, and which fine-tuning runs fit
   (`planner`: a pure function; its rule and the papers behind it are in its docstring); the
   plan, its reasons and the measurements go to plan.json and are printed;
3. pretrains bert (masked LM + next-sentence prediction), gpt and elmo as planned on WikiText-2
   train + the Gutenberg books with `egbert pretrain`'s defaults, each for its share of the
   budget, and saves each family's twin at its random initial weights (the planned size);
4. probes every model and twin with frozen features (`egbert probe`, each family's
   `quickstart-probe` recipe), and scores gpt and its twin by k-shot prompting (`egbert
   prompt-eval`);
5. fine-tunes the planned models (bert and its twin first, then gpt and elmo where they fit)
   on every GLUE task whose train and dev files are present, each run to the end of its
   recipe's epochs (or the plan's step cap), every model of a task for the same time; then bert
   and its twin with more seeds on the averaged tasks while the budget allows;
6. writes `results.md` and `results.json` (every table: pretraining, fine-tuning, probe, k-shot)
   and `results.png`, and prints the tables.

The budget is wall-clock time on whatever device runs it. Measuring takes MEASURE_SHARE of it at
most; pretraining what the planned fine-tuning and the evaluation leave, within PRETRAIN_SHARES
(split by FAMILY_SHARES; a family that reaches the plan's cap of passes stops early and leaves
its time to fine-tuning). The probe and the prompts get
EVALUATION_SHARE at most, the prompts PROMPT_SHARE of that: they start at a size (examples per
task) set by the budget, and a model and its twin after the first pair run smaller where the
runs measured before say the share left needs it (never below a tenth of the full size; results
say which sizes were used). Fine-tuning gets what is left, each run its share less the per-run
costs (start-up, data, evaluation, saving) measured on the runs before it. `plan.json` keeps the
options, the plan, each run's allotted minutes and sizes and the time spent, so that a rerun
after an interruption (SIGTERM or Ctrl-C stop the run in progress with a checkpoint) goes on
where it stopped, with the same plan and allotments. `--replay DIR` runs a finished run's plan
again into a new folder with every decision the clock made taken from DIR (`replay`).

The package: `options` (QuickstartArguments and every default, in one block), `throughput`
(timing training steps on the device), `planner` (the plan: pure functions), `budget` (the wall
clock, the evaluation sizes, plan.json), `steps` (the stages' reusable parts), `report` (typed
rows and tables), `replay` (a finished run's options, plan and clocks), `run` (the pipeline, top
to bottom). `egbert` exports `run_quickstart`, its options (`QuickstartArguments`) and two steps
(`save_untrained`, `finetune_options`); the rest is quickstart's own.
"""
