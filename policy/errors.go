package policy

import (
	"errors"
	"fmt"
	"strings"
)

// CompileError says a policy did not compile; the engine keeps the policy it
// had.
type CompileError struct {
	// Source names where the policy came from ("default", or the ConfigMaps).
	Source string
	// Err is the compiler's error, naming files and lines.
	Err error
}

// Error implements error.
func (e *CompileError) Error() string {
	return fmt.Sprintf("compile policy %s: %v", e.Source, e.Err)
}

// Unwrap returns the compiler's error.
func (e *CompileError) Unwrap() error { return e.Err }

// IsCompile reports whether err is, or wraps, a *CompileError.
func IsCompile(err error) bool {
	var ce *CompileError
	return errors.As(err, &ce)
}

// EvaluationError says the policy failed while deciding: a runtime error in
// Rego (a conflict, a type error), a result of the wrong shape, or a
// timeout. The webhook refuses the pod (fail closed) and counts it.
type EvaluationError struct {
	// Version is the policy version that failed.
	Version string
	// Err is what went wrong.
	Err error
}

// Error implements error.
func (e *EvaluationError) Error() string {
	return fmt.Sprintf("evaluate policy %s: %v", e.Version, e.Err)
}

// Unwrap returns the cause.
func (e *EvaluationError) Unwrap() error { return e.Err }

// IsEvaluation reports whether err is, or wraps, an *EvaluationError.
func IsEvaluation(err error) bool {
	var ee *EvaluationError
	return errors.As(err, &ee)
}

// DenialError is a policy's refusal: the deny messages of
// data.partita.admission, as the user should read them.
type DenialError struct {
	// Version is the policy version that refused.
	Version string
	// Messages are the deny messages, sorted.
	Messages []string
}

// Error joins the messages with "; ".
func (e *DenialError) Error() string {
	return strings.Join(e.Messages, "; ")
}

// IsDenial reports whether err is, or wraps, a *DenialError.
func IsDenial(err error) bool {
	var de *DenialError
	return errors.As(err, &de)
}
