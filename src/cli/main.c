#include "stepgraph.h"
int main(void){return 0;}
