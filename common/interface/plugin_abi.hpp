#pragma once
// The version of the binary interface between attnbench and an out-of-tree variant (a plugin, issue #29).
// A plugin records the value it was compiled with; the loader refuses one whose value differs from its own.
//
// Bump rule: increment ATTNBENCH_ABI_VERSION on any change to the headers a plugin compiles against
// (common/interface/attention.hpp, problem.hpp, params.hpp, half.hpp, util.hpp, plugin.hpp,
// plugin_entry.hpp): the Attention interface and its virtual functions, Problem, AttentionInputs,
// GradientArgs, Capabilities, ParamSpec, Registry, the registration macro, or any inline helper.
// tests/test_plugin_abi.cpp holds a hash of those headers' text (this one's too) per version and fails when
// they change without a bump (then bump here and update the hash there). Other headers a plugin may use (the
// shared kernels) are called, not laid out: a changed signature there leaves a symbol the loader's dlopen
// cannot find, which it reports as "built against another attnbench".
#define ATTNBENCH_ABI_VERSION 3
