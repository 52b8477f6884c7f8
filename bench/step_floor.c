/* A compiled prototype of jaxmon.step()'s common path and jaxmon.track()'s wrapper, for bench/step_floor.py only:
 * what a C extension would cost at the same point of the same loop (issue 38's question: is the rest of step()'s
 * time Python's, or the cache's?). Not part of jaxmon: nothing imports it but that bench, which builds it.
 *
 * Step(handed, waiter, sampler, no_calls, slow, max_pending): a callable of step()'s signature; a step that follows
 * on (the next host int, the same figure objects and calls, no look due, the waiter's and the sampler's attributes
 * read as jaxmon's step() reads them) is its hand-off time appended to `handed`; any other is `slow(...)`.
 * Tracked(fn, once, size, step): calls fn (vectorcall: no tuple, no dict) and sets the step's calls to `once` where
 * `size()` is 1, as jaxmon.track()'s wrapper does for a function with one compiled program. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *handed, *append, *waiter, *sampler, *no_calls, *calls, *programs;
    PyObject *last, *dispatched, *examples, *tokens, *model_flops, *last_ready, *slow;
    double previous, due;
    Py_ssize_t max_pending;
} Step;

static PyObject *s_want, *s_resumed_after, *s_taken, *s_modulus, *s_watch, *s_blocks, *s_retry;
static PyObject *k_examples, *k_tokens, *k_model_flops;
static PyObject *one;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static PyObject *step_call(PyObject *o, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Step *s = (Step *)o;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    double handed = now();
    double previous = s->previous; s->previous = handed;
    PyObject *calls = s->calls; s->calls = Py_NewRef(s->no_calls);  /* we own calls now */
    if (nargs < 1) goto slow;
    PyObject *number = args[0];
    PyObject *examples = Py_None, *tokens = Py_None, *model_flops = Py_None;
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (k == k_examples) examples = args[nargs + i];
        else if (k == k_tokens) tokens = args[nargs + i];
        else if (k == k_model_flops) model_flops = args[nargs + i];
        else goto slow;
    }
    if (!PyLong_CheckExact(number) || !PyLong_CheckExact(s->last)) goto slow;
    if (examples != s->examples || tokens != s->tokens || model_flops != s->model_flops) goto slow;
    if (calls != s->programs) { int eq = PyObject_RichCompareBool(calls, s->programs, Py_EQ); if (eq != 1) { PyErr_Clear(); goto slow; } }
    if (!(handed < s->due)) goto slow;
    PyObject *w = s->waiter;
    PyObject *want = PyObject_GetAttr(w, s_want); if (!want) { PyErr_Clear(); goto slow; }
    int wt = PyObject_IsTrue(want); Py_DECREF(want); if (wt) goto slow;
    PyObject *ra = PyObject_GetAttr(w, s_resumed_after); if (!ra) { PyErr_Clear(); goto slow; }
    double rad = PyFloat_AsDouble(ra); Py_DECREF(ra); if (!(handed - previous < rad)) goto slow;
    PyObject *tk = PyObject_GetAttr(w, s_taken); if (!tk) { PyErr_Clear(); goto slow; }
    Py_ssize_t taken = PyLong_AsSsize_t(tk); Py_DECREF(tk);
    if (PyObject_Size(s->handed) + taken >= s->max_pending) goto slow;
    PyObject *prev = PyNumber_Subtract(number, one); if (!prev) { PyErr_Clear(); goto slow; }
    int next = PyObject_RichCompareBool(prev, s->last, Py_EQ); Py_DECREF(prev); if (next != 1) goto slow;
    /* follows on */
    Py_SETREF(s->last, Py_NewRef(number)); Py_SETREF(s->dispatched, Py_NewRef(number));
    PyObject *ready = PyTuple_New(nargs - 1); for (Py_ssize_t i = 1; i < nargs; i++) PyTuple_SET_ITEM(ready, i - 1, Py_NewRef(args[i]));
    Py_SETREF(s->last_ready, ready);
    PyObject *f = PyFloat_FromDouble(handed);
    PyObject *r = PyObject_CallOneArg(s->append, f); Py_DECREF(f); Py_XDECREF(r);
    Py_DECREF(calls);
    /* the sampler's check */
    PyObject *mod = PyObject_GetAttr(s->sampler, s_modulus);
    long long m = PyLong_AsLongLong(mod); Py_DECREF(mod);
    long long n = PyLong_AsLongLong(number);
    PyObject *wa = PyObject_GetAttr(s->sampler, s_watch); long long watch = PyLong_AsLongLong(wa); Py_DECREF(wa);
    PyObject *bl = PyObject_GetAttr(s->sampler, s_blocks); PyObject *rt = PyObject_GetAttr(bl, s_retry); Py_DECREF(bl);
    int retry = rt != Py_None; Py_DECREF(rt);
    if ((m && (n + 2) % m == 0) || n == watch || retry) { /* jaxmon calls sampler.handed() here: never, in the bench */ }
    Py_RETURN_NONE;
slow:
    Py_DECREF(calls);
    return PyObject_Vectorcall(s->slow, args, nargsf, kwnames);
}

static int step_init(PyObject *o, PyObject *a, PyObject *kw) {
    Step *s = (Step *)o;
    if (!PyArg_ParseTuple(a, "OOOOOn", &s->handed, &s->waiter, &s->sampler, &s->no_calls, &s->slow, &s->max_pending)) return -1;
    Py_INCREF(s->handed); Py_INCREF(s->waiter); Py_INCREF(s->sampler); Py_INCREF(s->no_calls); Py_INCREF(s->slow);
    s->append = PyObject_GetAttrString(s->handed, "append");
    s->calls = Py_NewRef(s->no_calls); s->programs = Py_NewRef(s->no_calls);
    s->last = Py_NewRef(Py_None); s->dispatched = Py_NewRef(Py_None);
    s->examples = Py_NewRef(Py_None); s->tokens = Py_NewRef(Py_None); s->model_flops = Py_NewRef(Py_None);
    s->last_ready = PyTuple_New(0); s->previous = 1e300; s->due = 1e300;
    s->vectorcall = step_call;
    return 0;
}

static PyMemberDef step_members[] = {
    {"calls", T_OBJECT_EX, offsetof(Step, calls), 0, NULL},
    {"programs", T_OBJECT_EX, offsetof(Step, programs), 0, NULL},
    {"last", T_OBJECT_EX, offsetof(Step, last), 0, NULL},
    {"examples", T_OBJECT_EX, offsetof(Step, examples), 0, NULL},
    {"tokens", T_OBJECT_EX, offsetof(Step, tokens), 0, NULL},
    {"model_flops", T_OBJECT_EX, offsetof(Step, model_flops), 0, NULL},
    {"due", T_DOUBLE, offsetof(Step, due), 0, NULL},
    {NULL}
};

static PyTypeObject StepType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "step_floor_c.Step", .tp_basicsize = sizeof(Step),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Step, vectorcall), .tp_call = PyVectorcall_Call,
    .tp_init = step_init, .tp_new = PyType_GenericNew, .tp_members = step_members,
};

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn, *once, *size, *step;
} Tracked;

static PyObject *tracked_call(PyObject *o, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Tracked *t = (Tracked *)o;
    PyObject *out = PyObject_Vectorcall(t->fn, args, nargsf, kwnames);
    if (!out) return NULL;
    Step *s = (Step *)t->step;
    PyObject *n = PyObject_CallNoArgs(t->size);
    if (n) { if (PyLong_AsLong(n) == 1 && s->calls == s->no_calls) Py_SETREF(s->calls, Py_NewRef(t->once)); Py_DECREF(n); }
    else PyErr_Clear();
    return out;
}

static int tracked_init(PyObject *o, PyObject *a, PyObject *kw) {
    Tracked *t = (Tracked *)o;
    if (!PyArg_ParseTuple(a, "OOOO", &t->fn, &t->once, &t->size, &t->step)) return -1;
    Py_INCREF(t->fn); Py_INCREF(t->once); Py_INCREF(t->size); Py_INCREF(t->step);
    t->vectorcall = tracked_call; return 0;
}

static PyTypeObject TrackedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "step_floor_c.Tracked", .tp_basicsize = sizeof(Tracked),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Tracked, vectorcall), .tp_call = PyVectorcall_Call,
    .tp_init = tracked_init, .tp_new = PyType_GenericNew,
};

static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "step_floor_c", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_step_floor_c(void) {
    if (PyType_Ready(&StepType) < 0 || PyType_Ready(&TrackedType) < 0) return NULL;
    PyObject *m = PyModule_Create(&mod);
    PyModule_AddObject(m, "Step", (PyObject *)&StepType);
    PyModule_AddObject(m, "Tracked", (PyObject *)&TrackedType);
    s_want = PyUnicode_InternFromString("want"); s_resumed_after = PyUnicode_InternFromString("resumed_after");
    s_taken = PyUnicode_InternFromString("taken"); s_modulus = PyUnicode_InternFromString("modulus");
    s_watch = PyUnicode_InternFromString("watch"); s_blocks = PyUnicode_InternFromString("blocks");
    s_retry = PyUnicode_InternFromString("retry");
    k_examples = PyUnicode_InternFromString("examples"); k_tokens = PyUnicode_InternFromString("tokens");
    k_model_flops = PyUnicode_InternFromString("model_flops");
    one = PyLong_FromLong(1);
    return m;
}
