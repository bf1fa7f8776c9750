// dlaunch (launcher/dlaunch_main.h).
#include "launcher/dlaunch_main.h"

int main(int argc, char** argv) { return dlaunch::dlaunch_main(argc, argv); }
