# gmount.mk -- run every recipe on the gmount node that holds its prerequisites.
#
#     include $(shell gmount make-include)
#
# is the whole change to a Makefile (or run `gmount make [ARGS]` with none).
# make hands each recipe to gmount-job (SHELL, a small C program installed
# beside this file) together with its target and prerequisites; gmount-job asks
# the node daemon of the mount make runs in which node holds them (`place($^)`)
# and runs the recipe with /bin/sh there, in the same directory of that node's
# mount. Recipes for nodes on other machines (SSH clusters), and any recipe
# when the daemon has no job socket, go through the Python gmount-sh. $(shell ...)
# runs on this machine's mount as before. Recipes see GMOUNT_NODE, GMOUNT_SITE,
# GMOUNT_CLUSTER and GMOUNT_PLACEMENT_LOG. A recipe that fails on a node says
# which node on the line before make's own error.
#
# Outside a gmount mount (a laptop, a cluster that is down) nothing changes:
# make runs recipes itself, as without this file, after one notice line per run
# of make. `make -n` prints a hint; `gmount make -n` and `gmount plan` say which
# node each recipe would run on (they run make -n with GMOUNT_PLAN_FILE set:
# every recipe make would run is recorded there, nothing is placed).
#
# Settings (set them before the include, on the command line or in the environment):
#   GMOUNT_PLACEMENT_LOG  JSON lines, one per recipe (default: .gmount/make-<time>-<pid>.jsonl here)
#   GMOUNT_RECIPE_SHELL   the shell recipes run in on their node (default /bin/sh)
#   GMOUNT_SH             the wrapper (default: gmount-job beside this file, else the Python gmount-sh)
#   GMOUNT_SH_FALLBACK    the Python gmount-sh (default: installed beside this file's Python, else on PATH)

ifndef GMOUNT_MK_INCLUDED
GMOUNT_MK_INCLUDED := 1
# This file's directory, taken now: later includes (a generated diffs.mk, ...) change MAKEFILE_LIST.
GMOUNT_MK_DIR := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))/

# This file is <prefix>/lib/pythonX.Y/site-packages/gmountpy_make/gmount.mk in
# a normal install, so the Python wrapper is <prefix>/bin/gmount-sh; else use PATH.
GMOUNT_SH_FALLBACK ?= $(or $(abspath $(wildcard $(GMOUNT_MK_DIR)../../../../bin/gmount-sh)),gmount-sh)
export GMOUNT_SH_FALLBACK
GMOUNT_SH ?= $(or $(wildcard $(GMOUNT_MK_DIR)gmount-job),$(GMOUNT_SH_FALLBACK))

ifdef GMOUNT_PLAN_FILE
# `gmount plan`: make -n records each recipe line it would run (directory, target, prerequisites,
# separated by tabs) through SHELL's expansion, which make does per recipe line even when it only
# prints them. $(MAKE) lines run, with /bin/sh, as make -n runs them.
GMOUNT_EMPTY :=
GMOUNT_TAB := $(GMOUNT_EMPTY)	$(GMOUNT_EMPTY)
SHELL = $(if $@,$(file >>$(GMOUNT_PLAN_FILE),$(CURDIR)$(GMOUNT_TAB)$@$(GMOUNT_TAB)$^))/bin/sh
else

# Are recipes run from here placed? "place <time>-<make's pid>", or "local <why>" (not in a gmount
# mount, no daemon to ask). Asked before SHELL is set: make runs the program itself, no shell.
GMOUNT_CHECK := $(shell $(GMOUNT_SH) --gmount-check)
ifeq ($(firstword $(GMOUNT_CHECK)),place)

# One log per run of make: sub-makes inherit it through the environment.
ifeq ($(origin GMOUNT_PLACEMENT_LOG),undefined)
GMOUNT_PLACEMENT_LOG := $(CURDIR)/.gmount/make-$(word 2,$(GMOUNT_CHECK)).jsonl
endif
export GMOUNT_PLACEMENT_LOG

GMOUNT_RECIPE_SHELL ?= /bin/sh
export GMOUNT_RECIPE_SHELL

# make -n prints recipes, it does not run them: say once where to see their nodes.
ifeq ($(MAKELEVEL)$(MAKE_RESTARTS),0)
ifneq ($(findstring n,$(firstword -$(MAKEFLAGS))),)
$(shell echo 'gmount: make -n does not say where recipes would run; gmount make -n (same arguments) or gmount plan does' >&2)
endif
endif

# `=`, not `:=`: $@ and $^ must be expanded per recipe, when make runs it.
export GMOUNT_TARGET = $@
export GMOUNT_DEPS = $^
SHELL = $(GMOUNT_SH)

else
# Not placed: SHELL stays make's own, so recipes run exactly as without this file. One notice per
# run of make (sub-makes and a make restarted to read remade makefiles inherit GMOUNT_MK_NOTICE).
ifeq ($(GMOUNT_MK_NOTICE)$(MAKE_RESTARTS),)
GMOUNT_WHY := $(or $(wordlist 2,1000000,$(GMOUNT_CHECK)),$(GMOUNT_SH) cannot run (reinstall gmountpy))
$(shell printf '%s\n' 'gmount: $(subst ','\'',$(GMOUNT_WHY)): recipes run here, as plain make runs them' >&2)
endif
export GMOUNT_MK_NOTICE := 1
endif

endif
endif
