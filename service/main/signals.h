// SIGTERM/SIGINT handling for the server mains: block them in every thread, wait for one.
#pragma once

namespace moe::service {

// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts later. Call first
// thing in main(), before gRPC or the engine start threads.
void BlockTerminationSignals();
// Waits until SIGTERM or SIGINT arrives; returns its number.
int WaitForTerminationSignal();

}  // namespace moe::service
